// The core's one piece of process-wide state, shared by the files that
// make up operations.h: lifecycle.cc (init and shutdown), operations.cc
// (submission and queries), background_loop.cc (the cycle) and
// execution.cc (running responses). Internal to tf_ops/common.
#ifndef TFRING_COMMON_GLOBAL_STATE_H
#define TFRING_COMMON_GLOBAL_STATE_H

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "backend.h"
#include "config.h"
#include "parameter_manager.h"
#include "process_set.h"
#include "speculation_stats.h"
#include "status.h"
#include "timeline.h"
#include "topology.h"

namespace tfring {

// Why this rank asks the job to stop. Written by RequestShutdown
// (background_loop.h) from any thread, read by the loop's next round, reset
// by Initialize.
struct ShutdownRequest {
  std::mutex mu;  // guards the three below
  std::atomic<bool> requested{false};
  std::string reason;
  FailureCause cause = FailureCause::SHUTDOWN;
  int rank = -1;

  void Reset() {
    std::lock_guard<std::mutex> lock(mu);
    requested = false;
    reason.clear();
    cause = FailureCause::SHUTDOWN;
    rank = -1;
  }
};

// Whether collectives may be submitted: Initialize opens it, the background
// thread closes it when it ends, Enqueue checks it. Under its one mutex so
// that nothing slips in after the loop's final FailAll.
struct SubmissionGate {
  std::mutex mu;
  bool stopped = true;
  bool ever_initialized = false;
  Status stopped_status;  // what Enqueue reports once stopped
};

// The global set's speculation counters, copied by the thread that drives
// it, for GetRuntimeParams (tests check that speculation really happened).
struct SpeculationReport {
  std::mutex mu;  // guards stats
  SpeculationStats stats;
  std::atomic<int64_t> inline_responses{0};
};

// What the files of the core share (see the top). State that one file alone
// uses lives in that file: the init/shutdown transitions and the background
// thread in lifecycle.cc, the loop's wake-up and the driving of the sets
// (background thread or a submitting thread) in background_loop.cc.
struct GlobalState {
  ShutdownRequest shutdown;
  SubmissionGate gate;
  SpeculationReport speculation;

  // Set by Initialize before the background thread starts, read-only while
  // it runs; the loop frees them when it ends.
  Config config;
  Topology topo;
  std::unique_ptr<Backend> backend;
  ProcessSetTable process_sets;
  std::atomic<int> add_counter{0};
  // Set by the loop when communication broke, read by the next Initialize:
  // whether the backend whose communication broke can start again, and its
  // name for the message when it cannot.
  std::atomic<bool> comm_broken{false};
  bool broken_can_restart = false;
  std::string broken_backend;
  Timeline timeline;
  // Values autotune may change at run time (the same on every rank).
  std::atomic<double> cycle_time_ms{1.0};
  std::atomic<int64_t> fusion_threshold_bytes{0};
  std::atomic<int64_t> shm_min_bytes{0};
  std::unique_ptr<ParameterManager> tuner;  // global rank 0, TFRING_AUTOTUNE=1
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
