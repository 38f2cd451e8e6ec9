// The response cache: in steady state the same tensors are reduced every
// step, so instead of sending full requests to the coordinator each rank
// marks a bit for every tensor it has ready that matches a response the job
// already negotiated, and one bitwise-AND allreduce tells every rank which
// tensors are ready everywhere. Every rank updates its cache from the same
// responses in the same order, so a bit position means the same tensor on
// every rank.
#ifndef TFRING_COMMON_RESPONSE_CACHE_H
#define TFRING_COMMON_RESPONSE_CACHE_H

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

namespace tfring {

class ResponseCache {
 public:
  explicit ResponseCache(int capacity) : capacity_(capacity < 0 ? 0 : capacity) {}

  int capacity() const { return capacity_; }
  bool enabled() const { return capacity_ > 0; }
  static bool Cacheable(CollectiveType type);

  // The bit of the entry cached under `name`, or -1.
  int Find(const std::string& name) const;
  // True if bit `bit` holds `req`'s tensor with exactly this rank's request
  // (shape, dtype, op, root, scale factors, splits, device).
  bool Matches(int bit, const Request& req) const;
  // The single-tensor response stored at `bit`; marks it recently used.
  const Response& Use(int bit);
  bool Valid(int bit) const { return bit >= 0 && bit < capacity_ && entries_[bit].valid; }
  const Response& Peek(int bit) const { return entries_[bit].response; }

  // Records a negotiated single-tensor response together with this rank's
  // request for it (`mine` null when this rank never submitted it, e.g. it
  // had joined: it can then never hit, and invalidates the entry if asked).
  // Replaces an entry of the same name, else the least recently used one.
  void Put(const Response& response, const Request* mine);
  void Evict(int bit);

 private:
  struct Entry {
    bool valid = false;
    bool has_request = false;
    Request request;
    Response response;
    uint64_t last_used = 0;
  };
  static bool SameSignature(const Request& a, const Request& b);

  int capacity_;
  std::vector<Entry> entries_ = std::vector<Entry>(capacity_);
  std::unordered_map<std::string, int> by_name_;
  uint64_t clock_ = 0;
};

// Splits a fused allreduce response into one response per tensor.
std::vector<Response> SplitResponse(const Response& fused);

}  // namespace tfring

#endif  // TFRING_COMMON_RESPONSE_CACHE_H
