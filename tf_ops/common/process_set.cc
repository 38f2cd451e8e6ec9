#include "process_set.h"

namespace tfring {

std::shared_ptr<ProcessSet> ProcessSetTable::Get(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

void ProcessSetTable::Add(std::shared_ptr<ProcessSet> set) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_[set->id] = std::move(set);
}

std::shared_ptr<ProcessSet> ProcessSetTable::Remove(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return nullptr;
  auto set = it->second;
  sets_.erase(it);
  return set;
}

std::vector<std::shared_ptr<ProcessSet>> ProcessSetTable::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ProcessSet>> out;
  for (const auto& kv : sets_) out.push_back(kv.second);
  return out;
}

void ProcessSetTable::Snapshot(std::vector<std::shared_ptr<ProcessSet>>* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  out->clear();
  for (const auto& kv : sets_) out->push_back(kv.second);
}

size_t ProcessSetTable::Count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sets_.size();
}

void ProcessSetTable::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  sets_.clear();
}

}  // namespace tfring
