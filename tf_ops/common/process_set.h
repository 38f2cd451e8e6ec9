// A process set is a group of ranks that runs its own collectives: its own
// queue of pending tensors, its own negotiation (controller), its own data
// plane, and its own executors (one per device, each with its fusion
// buffer). Id 0 is the global set of all ranks.
#ifndef TFRING_COMMON_PROCESS_SET_H
#define TFRING_COMMON_PROCESS_SET_H

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "controller.h"
#include "peer_monitor.h"
#include "executor.h"
#include "ops/data_plane.h"
#include "tensor_queue.h"

namespace tfring {

struct ProcessSet {
  int32_t id = 0;
  std::vector<int> ranks;  // job-wide ranks, ascending
  int rank = -1;           // this process's rank in the set; -1 when not a member
  TensorQueue queue;
  std::unique_ptr<Controller> controller;  // null when not a member
  std::unique_ptr<DataPlane> data_plane;   // null when not a member
  ExecutorTable executors;
  // Storage a round reuses, kept with the set rather than with a thread: a
  // set is driven by one thread at a time (background_loop.cc: driving), the background thread
  // or a submitting one (DriveInline), and per-thread storage grew again
  // whenever the other thread took its turn.
  struct RoundScratch {
    RequestList requests;    // this rank's, for the controller (RunLoopOnce)
    ResponseList responses;  // the controller's answer
    std::vector<ReduceSlot> slots;  // a speculated allreduce's tensors
  } round;

  bool included() const { return rank >= 0; }
  int size() const { return static_cast<int>(ranks.size()); }
};

class ProcessSetTable {
 public:
  std::shared_ptr<ProcessSet> Get(int32_t id) const;
  void Add(std::shared_ptr<ProcessSet> set);
  std::shared_ptr<ProcessSet> Remove(int32_t id);
  std::vector<std::shared_ptr<ProcessSet>> All() const;  // by ascending id
  // All() into `out` (cleared first; its capacity is kept, so a caller that
  // reuses one buffer allocates nothing per collective).
  void Snapshot(std::vector<std::shared_ptr<ProcessSet>>* out) const;
  size_t Count() const;
  void Clear();

 private:
  mutable std::mutex mu_;
  std::map<int32_t, std::shared_ptr<ProcessSet>> sets_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_PROCESS_SET_H
