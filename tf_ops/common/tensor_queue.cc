#include "tensor_queue.h"

namespace tfring {

Request TensorTableEntry::ToRequest(int32_t rank) const {
  Request r = SpareRequests().Copy(*this);
  r.request_rank = rank;
  return r;
}

Status TensorQueue::Add(TensorTableEntry entry, int32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (table_.count(entry.name)) {
    return Status::InvalidArgument(
        "tfring: a collective named '" + entry.name +
        "' is already in flight on this rank; give concurrent collectives distinct names");
  }
  if (!abandoned_.empty() && abandoned_.count(entry.name)) {
    held_.push_back(entry.ToRequest(rank));
  } else {
    new_requests_.push_back(entry.ToRequest(rank));
  }
  if (!spare_nodes_.empty()) {
    auto node = std::move(spare_nodes_.back());
    spare_nodes_.pop_back();
    node.key() = entry.name;
    node.mapped() = std::move(entry);
    table_.insert(std::move(node));
  } else {
    std::string name = entry.name;
    table_.emplace(std::move(name), std::move(entry));
  }
  return Status::OK();
}

bool TensorQueue::Abandon(Request request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (table_.count(request.name) || !abandoned_.insert(request.name).second) return false;
  new_requests_.push_back(std::move(request));
  return true;
}

bool TensorQueue::EndAbandoned(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (abandoned_.empty() || !abandoned_.erase(name)) return false;
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->name == name) {
      new_requests_.push_back(std::move(*it));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return true;
}

void TensorQueue::PopRequests(std::vector<Request>* out) {
  std::vector<std::pair<TensorTableEntry, Status>> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Request>& waiting = waiting_;
    waiting.clear();
    for (Request& req : new_requests_) {
      auto it = table_.find(req.name);
      // An event the device can wait for is waited for where the collective
      // runs (Executor::AwaitInput): the request is negotiated now.
      const DeviceEvent* event = it == table_.end() ? nullptr : it->second.ready_event.get();
      Status ready = event == nullptr || event->waits_on_device()
                         ? Status::OK()
                         : it->second.ready_event->Query();
      if (ready.ok()) {
        out->push_back(std::move(req));
      } else if (ready.in_progress()) {
        waiting.push_back(std::move(req));
      } else {
        failed.push_back({std::move(it->second), ready});
        table_.erase(it);
      }
    }
    new_requests_.swap(waiting);
    waiting.clear();
  }
  // Callbacks run outside the lock: they may re-enter the queue.
  for (auto& f : failed) f.first.callback(f.second, -1);
}

bool TensorQueue::Take(const std::string& name, TensorTableEntry* entry) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return false;
  *entry = std::move(it->second);
  if (spare_nodes_.size() >= kSpareNodes) {
    table_.erase(it);
    return true;
  }
  auto node = table_.extract(it);
  // Moved from, but nothing it held may stay alive here: a callback's
  // captures (a Python request), the ready event.
  TensorTableEntry& spare = node.mapped();
  spare.callback = nullptr;
  spare.allocate_output = nullptr;
  spare.set_received_splits = nullptr;
  spare.ready_event.reset();
  spare_nodes_.push_back(std::move(node));
  return true;
}

bool TensorQueue::Peek(const std::string& name, const void** input, void** output) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return false;
  *input = it->second.input;
  *output = it->second.output;
  return true;
}

void TensorQueue::FailAll(const Status& status) {
  std::unordered_map<std::string, TensorTableEntry> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    table.swap(table_);
    new_requests_.clear();
    abandoned_.clear();
    held_.clear();
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

bool TensorQueue::HasUnannounced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !new_requests_.empty();
}

size_t TensorQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.size();
}

}  // namespace tfring
