// The core's one piece of process-wide state, shared by the files that
// make up operations.h: lifecycle.cc (init and shutdown), operations.cc
// (submission and queries), background_loop.cc (the cycle) and
// execution.cc (running responses). Internal to tf_ops/common.
#ifndef TFRING_COMMON_GLOBAL_STATE_H
#define TFRING_COMMON_GLOBAL_STATE_H

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "config.h"
#include "operations.h"
#include "parameter_manager.h"
#include "process_set.h"
#include "timeline.h"
#include "topology.h"

namespace tfring {

struct GlobalState {
  std::mutex lifecycle_mu;  // init/shutdown transitions
  std::atomic<bool> running{false};
  std::atomic<bool> shutdown_requested{false};
  // Why this rank asks the job to stop; guarded by reason_mu.
  std::mutex reason_mu;
  std::string shutdown_reason;
  FailureCause shutdown_cause = FailureCause::SHUTDOWN;
  int shutdown_rank = -1;
  // Guards `stopped` against Enqueue so nothing slips in after the final FailAll.
  std::mutex enqueue_mu;
  bool stopped = true;
  bool ever_initialized = false;
  Status stopped_status;  // what Enqueue reports once stopped

  Config config;
  Topology topo;
  std::unique_ptr<Backend> backend;
  ProcessSetTable process_sets;
  std::thread background;
  std::atomic<int> add_counter{0};
  std::atomic<bool> comm_broken{false};
  // Whether the backend whose communication broke can start again (set with
  // comm_broken); its name for the message when it cannot.
  bool broken_can_restart = false;
  std::string broken_backend;
  Timeline timeline;
  // Values autotune may change at run time (the same on every rank).
  std::atomic<double> cycle_time_ms{1.0};
  std::atomic<int64_t> fusion_threshold_bytes{0};
  std::atomic<int64_t> shm_min_bytes{0};
  std::unique_ptr<ParameterManager> tuner;  // global rank 0, TFRING_AUTOTUNE=1

  // Wakes the background thread when work arrives, so a cycle starts at once
  // instead of at the next tick.
  std::mutex wake_mu;
  std::condition_variable wake_cv;
  // Atomic so that a loop spinning for new work can watch it without the lock.
  std::atomic<bool> wake{false};

  // The global set's speculation counters, copied by the background thread
  // for GetRuntimeParams (tests check that speculation really happened).
  std::mutex spec_mu;
  SpeculationCounters spec_stats;

  // One thread at a time drives the controllers and data planes: the
  // background thread for each cycle, or a submitting thread that runs a
  // speculated response itself (DriveInline).
  std::mutex drive_mu;
  // Under drive_mu: whether the loop runs and the sets may be driven; and a
  // stop that a submitting thread's cycle ran into, for the loop to act on.
  bool drive_open = false;
  bool inline_stop = false;
  bool inline_broken = false;
  Status inline_why;
  // Under drive_mu: when a cycle last ran responses, and whether their peers
  // were there at once (DriveInline's rule).
  std::chrono::steady_clock::time_point last_ran;
  bool ran_in_step = false;
  std::atomic<int64_t> inline_responses{0};
};

// Never destroyed: kernels may still hold callbacks into the core while the
// process exits, and static destruction order is not ours to control.
// Inline, so that every file's hot path reaches it without a call.
inline GlobalState& state() {
  static GlobalState* s = new GlobalState();
  return *s;
}

}  // namespace tfring

#endif  // TFRING_COMMON_GLOBAL_STATE_H
