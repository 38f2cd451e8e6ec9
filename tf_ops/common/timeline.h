// The timeline: a Chrome trace-event JSON file (open it in Perfetto or
// chrome://tracing) showing, for every tensor, when it was negotiated (with a
// tick for each rank that became ready, when the coordinator sees it), when
// it waited, and each phase of running it: copies into and out of the fusion
// buffer and the collective itself, named after the data plane that ran it.
// Rank 0 writes it. Each tensor gets its own row ("process" in trace terms).
#ifndef TFRING_COMMON_TIMELINE_H
#define TFRING_COMMON_TIMELINE_H

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

#include "status.h"

namespace tfring {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts writing to `path` (truncating it), closing any running timeline.
  // Only call on the writing rank.
  Status Start(const std::string& path, bool mark_cycles);
  // Closes the JSON array so the file is valid JSON. Safe to call twice.
  void Stop();
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // A tensor was submitted on this rank: its negotiation starts.
  void NegotiateStart(const std::string& name, const char* collective);
  // The coordinator saw `rank` submit `name`.
  void NegotiateRankReady(const std::string& name, int rank);
  // Negotiation is over; the tensor waits for its turn to run.
  void NegotiateEnd(const std::string& name);
  // A phase of running the tensor, from `start` to now (e.g. "MPI_ALLREDUCE").
  void Activity(const std::string& name, const std::string& activity, Clock::time_point start);
  // The tensor is done (its output is ready).
  void End(const std::string& name);
  void MarkCycle();

 private:
  int64_t Micros(Clock::time_point t) const;
  int RowFor(const std::string& name);  // caller holds mu_
  void Write(const std::string& event);  // caller holds mu_

  std::atomic<bool> enabled_{false};
  bool mark_cycles_ = false;
  std::mutex mu_;
  std::FILE* file_ = nullptr;
  bool first_ = true;
  Clock::time_point origin_;
  std::unordered_map<std::string, int> rows_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_TIMELINE_H
