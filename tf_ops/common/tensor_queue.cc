#include "tensor_queue.h"

namespace tfring {

Request TensorTableEntry::ToRequest(int32_t rank) const {
  Request r;
  r.request_rank = rank;
  r.type = type;
  r.dtype = dtype;
  r.name = name;
  r.root_rank = root_rank;
  r.reduce_op = reduce_op;
  r.prescale_factor = prescale_factor;
  r.postscale_factor = postscale_factor;
  r.shape = shape;
  r.splits = splits;
  r.group_name = group_name;
  r.group_size = group_size;
  r.group_index = group_index;
  return r;
}

Status TensorQueue::Add(TensorTableEntry entry, int32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (table_.count(entry.name)) {
    return Status::InvalidArgument(
        "tfring: a collective named '" + entry.name +
        "' is already in flight on this rank; give concurrent collectives distinct names");
  }
  new_requests_.push_back(entry.ToRequest(rank));
  std::string name = entry.name;
  table_.emplace(std::move(name), std::move(entry));
  return Status::OK();
}

void TensorQueue::PopRequests(std::vector<Request>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->insert(out->end(), std::make_move_iterator(new_requests_.begin()),
              std::make_move_iterator(new_requests_.end()));
  new_requests_.clear();
}

bool TensorQueue::Take(const std::string& name, TensorTableEntry* entry) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return false;
  *entry = std::move(it->second);
  table_.erase(it);
  return true;
}

void TensorQueue::FailAll(const Status& status) {
  std::unordered_map<std::string, TensorTableEntry> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    table.swap(table_);
    new_requests_.clear();
  }
  // Callbacks run outside the lock: they may re-enter the queue.
  for (auto& kv : table) kv.second.callback(status, -1);
}

std::vector<std::string> TensorQueue::PendingNames() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& kv : table_) names.push_back(kv.first);
  return names;
}

size_t TensorQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.size();
}

}  // namespace tfring
