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
#include "in_flight.h"
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
  InFlight in_flight;  // started collectives the device has not finished
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

// What a communication backend (a transport: MPI, TCP) provides: a way to
// build a process set's controller and data plane. The operations and the
// kernels never learn which one runs.
class Backend {
 public:
  virtual ~Backend() = default;
  // "mpi" or "tcp": for messages and logs.
  virtual const char* name() const = 0;
  // Whether init() may run again in this process after this backend's
  // communication broke (a peer died, a link failed). MPI cannot: its
  // failures are fatal to the whole job. A transport that can tear down and
  // rebuild its connections (elastic training needs it) says yes.
  virtual bool can_restart_after_failure() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective over all ranks of the job. Fills `set`'s controller and data
  // plane (left null when this rank is not in `set->ranks`).
  virtual Status CreateProcessSet(ProcessSet* set, const Config& config) = 0;
  virtual bool threads_supported() const = 0;
  // Lets waits give up when a peer process dies (see PeerMonitor).
  virtual void set_peer_monitor(std::shared_ptr<PeerMonitor> monitor) = 0;
  // The host of every job-wide rank; sets created afterwards can use
  // shared memory within a host. Until then sets use the fallback plane only
  // (see ops/data_plane_factory.h).
  virtual void set_hosts(std::vector<std::string> hosts) = 0;
};

}  // namespace tfring

#endif  // TFRING_COMMON_PROCESS_SET_H
