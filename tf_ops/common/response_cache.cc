#include "response_cache.h"

namespace tfring {

bool ResponseCache::Cacheable(CollectiveType type) {
  switch (type) {
    case CollectiveType::ALLREDUCE:
    case CollectiveType::ALLGATHER:
    case CollectiveType::BROADCAST:
    case CollectiveType::ALLTOALL:
    case CollectiveType::REDUCESCATTER:
      return true;
    default:
      return false;  // join, barrier and process-set changes always negotiate
  }
}

int ResponseCache::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

bool ResponseCache::SameSignature(const Request& a, const Request& b) {
  return a.type == b.type && a.dtype == b.dtype && a.shape == b.shape &&
         a.root_rank == b.root_rank && a.reduce_op == b.reduce_op &&
         a.prescale_factor == b.prescale_factor && a.postscale_factor == b.postscale_factor &&
         a.splits == b.splits && a.group_name == b.group_name && a.group_size == b.group_size &&
         a.group_index == b.group_index && a.device == b.device &&
         a.same_rows == b.same_rows && a.abandoned == b.abandoned;
}

bool ResponseCache::Matches(int bit, const Request& req) const {
  if (!Valid(bit)) return false;
  const Entry& e = entries_[bit];
  return e.has_request && e.request.name == req.name && SameSignature(e.request, req);
}

const Response& ResponseCache::Use(int bit) {
  entries_[bit].last_used = ++clock_;
  return entries_[bit].response;
}

void ResponseCache::Evict(int bit) {
  if (!Valid(bit)) return;
  by_name_.erase(entries_[bit].response.tensor_names[0]);
  entries_[bit] = Entry();
}

void ResponseCache::Put(const Response& response, const Request* mine) {
  if (!enabled()) return;
  const std::string& name = response.tensor_names[0];
  int bit = Find(name);
  if (bit < 0) {
    // A free slot, else the least recently used one. Every rank runs the same
    // sequence of Put/Use/Evict, so every rank picks the same slot.
    uint64_t oldest = UINT64_MAX;
    for (int b = 0; b < capacity_; ++b) {
      if (!entries_[b].valid) {
        bit = b;
        break;
      }
      if (entries_[b].last_used < oldest) {
        oldest = entries_[b].last_used;
        bit = b;
      }
    }
    Evict(bit);
  }
  Entry& e = entries_[bit];
  e.valid = true;
  e.has_request = mine != nullptr;
  if (mine) e.request = *mine;
  e.response = response;
  e.last_used = ++clock_;
  by_name_[name] = bit;
}

std::vector<Response> SplitResponse(const Response& fused) {
  std::vector<Response> out;
  if (fused.collective != CollectiveType::ALLREDUCE || fused.tensor_names.size() <= 1) {
    out.push_back(fused);
    return out;
  }
  for (size_t i = 0; i < fused.tensor_names.size(); ++i) {
    Response r = fused;
    r.tensor_names = {fused.tensor_names[i]};
    r.tensor_sizes = {fused.tensor_sizes[i]};
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace tfring
