// Running negotiated responses on a process set: each Perform* issues every
// data-plane call of a response before returning, so each plane sees the
// same order on every rank; a device may finish later, and its tensors then
// complete from the device watchdog (device_watchdog.h). Completions can be
// deferred until the driving thread lets go (DeferCompletions). Internal to
// tf_ops/common: the background loop and speculation_run.cc call it.
#ifndef TFRING_COMMON_EXECUTION_H
#define TFRING_COMMON_EXECUTION_H

#include <chrono>
#include <string>
#include <vector>

#include "executor.h"
#include "message.h"
#include "process_set.h"
#include "status.h"
#include "tensor_queue.h"

namespace tfring {

using Clock = std::chrono::steady_clock;

// Waits at shutdown for collectives a device is still running.
constexpr double kDrainSeconds = 10.0;

// Completions of a cycle, handed to their callbacks once the driving thread
// has let go of the driving lock (background_loop.cc): a callback makes TF start the op that consumes the
// result, which submits at once, and that submission should find nobody
// driving, so that it runs its collective itself (DriveInline) rather than
// hand it to the background thread.
struct Deferred {
  DoneCallback callback;
  Status status;
  int32_t result;
};

// While one lives, Complete() on this thread queues callbacks into `into`
// instead of calling them; RunDeferred calls them later.
class DeferCompletions {
 public:
  explicit DeferCompletions(std::vector<Deferred>* into);
  ~DeferCompletions();

 private:
  std::vector<Deferred>* prev_;
};

void RunDeferred(std::vector<Deferred>* list);

// Ends the entry's timeline span and hands it its result.
void Complete(TensorTableEntry& e, const Status& s, int32_t result = -1);

// Records one phase of running `names` on the timeline, e.g. "MPI_ALLREDUCE"
// (the plane that ran it, then the collective: `what` then `collective`
// joined by "_" when `collective` is given). Nothing is built while the
// timeline is off.
void Phase(const std::vector<std::string>& names, const char* what, Clock::time_point start,
           const char* collective = nullptr);
// The executor's phase recorder for `r` (PhaseFn), or an empty one while the
// timeline is off. `r` must outlive it.
PhaseFn PhasesOf(const Response& r);

// A vector this thread reuses, one per nesting level (up to 4; deeper ones
// are their own): a per-cycle vector's buffer was an allocation per
// collective. Emptied when it goes out of scope, so it keeps nothing alive.
template <typename T>
class Reused {
 public:
  Reused() : v_(Depth() < kDepth ? &Buffers()[Depth()] : &own_) { ++Depth(); }
  ~Reused() {
    v_->clear();
    --Depth();
  }
  Reused(const Reused&) = delete;
  Reused& operator=(const Reused&) = delete;
  std::vector<T>& operator*() { return *v_; }
  std::vector<T>* operator->() { return v_; }

 private:
  static constexpr int kDepth = 4;
  static std::vector<T>* Buffers() {
    thread_local std::vector<T> buffers[kDepth];
    return buffers;
  }
  static int& Depth() {
    thread_local int depth = 0;
    return depth;
  }
  std::vector<T> own_;
  std::vector<T>* v_;
};

// Completes those of `names` this rank has queued with `s`.
void CompleteQueued(ProcessSet& ps, const std::vector<std::string>& names, const Status& s);

// The plane and executor for a collective of `bytes` on `device`.
Status Route(ProcessSet& ps, CollectiveType type, int32_t device, int64_t bytes, DataPlane** plane,
             Executor** executor);

// The bytes of a response's tensors (of this rank's share: element counts
// times the dtype's size).
int64_t TotalBytes(const Response& r);

// Starts one negotiated response (or completes its tensors with its error).
void PerformOperation(ProcessSet& ps, const Response& r);

}  // namespace tfring

#endif  // TFRING_COMMON_EXECUTION_H
