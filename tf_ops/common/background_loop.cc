#include "background_loop.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <pthread.h>
#include <vector>

#include "device_watchdog.h"
#include "execution.h"
#include "global_state.h"
#include "gpu_support.h"
#include "logging.h"
#include "operations.h"
#include "ops/data_plane_selector.h"
#include "speculation_run.h"
#include "transport/communicator.h"

namespace tfring {

namespace {

// Whether this thread already drives (holds driving().mu): the background thread,
// or a submitting thread whose completion callback submits again inline.
thread_local bool t_driving = false;

// A negotiation round at least this long means the ranks are out of step.
constexpr std::chrono::microseconds kInStepRound{500};
// A submitting thread runs a speculated response itself only this soon
// after the last one ran in step (DriveInline).
constexpr std::chrono::microseconds kInlineGap{500};

// The loop's wake-up: a submission wakes the background thread at once.
struct Wakeup {
  std::mutex mu;
  std::condition_variable cv;
  bool wake = false;
};

// A failure the device watchdog found (a dead peer under device work): the
// loop stops with it at its next cycle. Its own lock, so that the watchdog
// never waits for a cycle that may itself be waiting for the dead peer.
struct DeviceStop {
  std::mutex mu;
  std::atomic<bool> requested{false};
  Status why;
};

// Who drives the controllers and data planes: one thread at a time, the
// background thread for each cycle or a submitting thread that runs a
// speculated response itself (DriveInline).
struct Driving {
  std::mutex mu;
  // Under mu: whether the loop runs and the sets may be driven; and a stop
  // that a submitting thread's cycle ran into, for the loop to act on.
  bool open = false;
  bool inline_stop = false;
  bool inline_broken = false;
  Status inline_why;
  // Under mu: when a cycle last ran responses, and whether their peers
  // were there at once (DriveInline's rule).
  Clock::time_point last_ran;
  bool ran_in_step = false;
};

// This file's alone; never destroyed, as state() (global_state.h).
Wakeup& wakeup() {
  static Wakeup* w = new Wakeup();
  return *w;
}
Driving& driving() {
  static Driving* d = new Driving();
  return *d;
}
DeviceStop& device_stop() {
  static DeviceStop* s = new DeviceStop();
  return *s;
}

// The process sets as of now, in a buffer this thread reuses (Reused): a
// fresh vector per look cost allocations per collective (issue 38).
class SetsNow {
 public:
  SetsNow() { state().process_sets.Snapshot(&*sets_); }
  std::vector<std::shared_ptr<ProcessSet>>::const_iterator begin() { return sets_->begin(); }
  std::vector<std::shared_ptr<ProcessSet>>::const_iterator end() { return sets_->end(); }

 private:
  Reused<std::shared_ptr<ProcessSet>> sets_;
};

}  // namespace

void WakeBackground() {
  Wakeup& w = wakeup();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.wake = true;
  }
  w.cv.notify_one();
}

void StopForDeviceFailure(const Status& why) {
  DeviceStop& d = device_stop();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.requested) return;
    d.why = why;
    d.requested = true;
  }
  WakeBackground();
}

namespace {

// Bytes reduced by a cycle's responses: autotune's measure of progress.
int64_t ReducedBytes(const ResponseList& list) {
  int64_t bytes = 0;
  for (const Response& r : list.responses) {
    if (r.type != ResponseType::COLLECTIVE) continue;
    if (r.collective != CollectiveType::ALLREDUCE && r.collective != CollectiveType::REDUCESCATTER)
      continue;
    for (int64_t n : r.tensor_sizes) bytes += n * DataTypeSize(r.dtype);
  }
  return bytes;
}

// Every rank applies the coordinator's tuned values at the same point.
void ApplyTunedParams(const ResponseList& p) {
  GlobalState& st = state();
  st.cycle_time_ms = p.cycle_time_ms;
  st.fusion_threshold_bytes = p.fusion_threshold_bytes;
  st.shm_min_bytes = p.shm_min_bytes;
  for (const auto& ps : SetsNow()) {
    if (!ps->included()) continue;
    ps->controller->set_fusion_threshold(p.fusion_threshold_bytes);
    if (auto* selector = dynamic_cast<DataPlaneSelector*>(ps->data_plane.get())) {
      DataPlaneChoice choice = selector->choice();
      choice.shm_min_bytes = p.shm_min_bytes;
      selector->set_choice(choice);
    }
  }
  TFRING_LOG(DEBUG) << "tuned values: fusion threshold " << p.fusion_threshold_bytes
                    << " bytes, cycle time " << p.cycle_time_ms << " ms, shm cut-over "
                    << p.shm_min_bytes << " bytes";
}

// Runs one negotiation round on every process set this rank belongs to.
// Returns false when the job is shutting down; `why` then says why, and
// `broken` whether communication itself failed (a dead peer, a transport error).
// `negotiation` gets how long the global set's negotiation round took.
bool RunLoopOnce(Status* why, bool* broken, int* executed, Clock::duration* negotiation) {
  GlobalState& st = state();
  st.timeline.MarkCycle();
  const bool global_alone = st.process_sets.Count() == 1;
  for (const auto& ps : SetsNow()) {
    // A set removed earlier in this round is gone on every rank alike.
    if (!ps->included() || !st.process_sets.Get(ps->id)) continue;
    // Reused from round to round (their vectors keep their capacity):
    // RunLoopOnce never runs inside itself (t_driving), and one thread at a
    // time drives (driving().mu).
    RequestList& mine = ps->round.requests;
    ResponseList& responses = ps->round.responses;
    mine.requests.clear();
    mine.shutdown = false;
    mine.shutdown_reason.clear();
    mine.shutdown_cause = 0;
    mine.shutdown_rank = -1;
    ps->queue.PopRequests(&mine.requests);
    if (ps->id == kGlobalProcessSetId && st.shutdown.requested) {
      std::lock_guard<std::mutex> lock(st.shutdown.mu);
      mine.shutdown = true;
      mine.shutdown_reason = st.shutdown.reason;
      mine.shutdown_cause = static_cast<int32_t>(st.shutdown.cause);
      mine.shutdown_rank = st.shutdown.rank;
    }
    // Speculation needs the global set alone: a rank waiting inside a
    // speculative collective must not be needed by another set's round.
    ps->controller->set_speculation_allowed(st.config.speculation &&
                                            ps->id == kGlobalProcessSetId &&
                                            global_alone);
    const auto round_start = Clock::now();
    Status s = ps->controller->ComputeResponseList(std::move(mine), &responses);
    if (ps->id == kGlobalProcessSetId) *negotiation = Clock::now() - round_start;
    if (!s.ok()) {
      *broken = true;
      // A failure that names its peer (the peer monitor, the transport's
      // liveness) says all; any other gets the set it happened in.
      const bool names_peer = s.cause() == FailureCause::PEER_FAILURE && s.rank() >= 0;
      *why = Status::Make(StatusCode::ABORTED, s.cause(),
                          names_peer ? s.message()
                                     : "tfring stopped after a communication failure in "
                                       "process set " + std::to_string(ps->id) + ": " +
                                           s.message(),
                          s.rank());
      return false;
    }
    if (st.timeline.enabled()) {
      for (const Response& r : responses.responses)
        for (const auto& name : r.tensor_names) st.timeline.NegotiateEnd(name);
    }
    // Tuned values take effect before this round's collectives run: a rank
    // woken by one of them must already see the values of that round.
    if (ps->id == kGlobalProcessSetId && responses.has_params) ApplyTunedParams(responses);
    bool fell_back = false;
    for (const Response& r : responses.responses) {
      if (!r.speculative) {
        PerformOperation(*ps, r);
        continue;
      }
      // Every rank stops at the same flagged response; the rest of the
      // list was handed out on this rank only.
      if (fell_back) continue;
      // Time spent waiting in the plane for a peer is what a negotiation
      // round would have waited: it says whether the ranks run in step.
      Clock::duration waited{};
      const SpeculationOutcome outcome = PerformSpeculative(*ps, r, &waited);
      ps->controller->SpeculationResult(outcome);
      fell_back = outcome != SpeculationOutcome::AGREED;
      if (ps->id == kGlobalProcessSetId) *negotiation += waited;
    }
    *executed += static_cast<int>(responses.responses.size());
    if (ps->id == kGlobalProcessSetId) {
      if (st.tuner) {
        st.tuner->RecordCycle(ReducedBytes(responses), std::chrono::steady_clock::now());
        if (st.tuner->HasUpdate()) {
          TunableParams p = st.tuner->TakeUpdate();
          ps->controller->SendParams(p.fusion_threshold_bytes, p.cycle_time_ms, p.shm_min_bytes);
        }
      }
    }
    if (ps->id == kGlobalProcessSetId) {
      const auto& c = ps->controller->speculation_stats();
      std::lock_guard<std::mutex> lock(st.speculation.mu);
      st.speculation.stats = c;
    }
    if (ps->id == kGlobalProcessSetId && responses.shutdown) {
      // The rank is the one whose shutdown() (or end of script) stopped the
      // job, or for a stall (a timeout) the rank the tensor waited for.
      *why = Status::Make(StatusCode::ABORTED, static_cast<FailureCause>(responses.shutdown_cause),
                          "tfring has been shut down: " + responses.shutdown_reason +
                              ". Collectives can no longer run in this job.",
                          responses.shutdown_rank);
      return false;
    }
  }
  return true;
}

}  // namespace

void RequestShutdown(FailureCause cause, const std::string& reason, int rank) {
  GlobalState& st = state();
  {
    std::lock_guard<std::mutex> lock(st.shutdown.mu);
    if (st.shutdown.requested) return;
    st.shutdown.reason = reason;
    st.shutdown.cause = cause;
    st.shutdown.rank = rank;
  }
  st.shutdown.requested = true;
  WakeBackground();
}

namespace {

// On each set's coordinator: warns about tensors some ranks have submitted
// and others have not, every stall_check_time_s; past stall_shutdown_time_s
// (when set) stops the job, so every rank gets an error naming the tensor
// and the missing ranks instead of waiting forever.
void CheckForStalls(std::chrono::steady_clock::time_point* last_warning) {
  GlobalState& st = state();
  const Config& c = st.config;
  if (c.stall_check_disabled) return;
  const bool warn_due = c.stall_check_time_s > 0 &&
                        std::chrono::steady_clock::now() - *last_warning >=
                            std::chrono::duration<double>(c.stall_check_time_s);
  const bool can_stop = c.stall_shutdown_time_s > 0;
  if (!warn_due && !can_stop) return;
  // Look at tensors old enough for whichever comes first, warning or stop.
  double threshold = c.stall_check_time_s > 0 ? c.stall_check_time_s : c.stall_shutdown_time_s;
  if (can_stop) threshold = std::min(threshold, c.stall_shutdown_time_s);
  for (const auto& ps : SetsNow()) {
    if (!ps->included() || !ps->controller->is_coordinator()) continue;
    for (const auto& stalled : ps->controller->StalledTensors(threshold)) {
      std::string missing;
      for (int r : stalled.second) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      std::string what = "tensor '" + stalled.first.name + "' in process set " +
                         std::to_string(ps->id) + " has waited " +
                         std::to_string(static_cast<int>(stalled.first.seconds)) +
                         " s for ranks [" + missing + "] to submit it";
      if (warn_due && stalled.first.seconds >= c.stall_check_time_s) {
        TFRING_LOG(WARNING) << "Stall: " << what
                            << ". Ranks must submit the same collectives; one of them may be "
                               "stuck or on a different code path.";
      }
      if (can_stop && stalled.first.seconds >= c.stall_shutdown_time_s) {
        RequestShutdown(FailureCause::TIMEOUT,
                        "a stall: " + what + " (TFRING_STALL_SHUTDOWN_TIME_SECONDS=" +
                            std::to_string(static_cast<int>(c.stall_shutdown_time_s)) + ")",
                        stalled.second.empty() ? -1 : stalled.second.front());
      }
    }
  }
  if (warn_due) *last_warning = std::chrono::steady_clock::now();
}

// True while this rank has collectives submitted and not yet started (or
// agreed by the cache and not yet run). Collectives a device is running are
// the watchdog's (device_watchdog.h): their completion needs no cycle.
bool HasPendingWork() {
  for (const auto& ps : SetsNow()) {
    if (!ps->included()) continue;
    if (ps->queue.size() > 0 || ps->controller->HasPendingHits()) return true;
  }
  return false;
}

// Under driving().mu, after a cycle that ran `executed` responses of which the
// global set's took `negotiation` (for speculated ones: waiting for peers).
void NoteCycle(int executed, Clock::duration negotiation) {
  Driving& d = driving();
  if (executed == 0) return;
  d.last_ran = Clock::now();
  d.ran_in_step = negotiation < kInStepRound;
}

}  // namespace

bool DriveInline(ProcessSet& ps) {
  GlobalState& st = state();
  // A completion the watchdog runs may submit: its thread must stay free to
  // watch the device, so the background thread negotiates that one.
  if (t_driving || !st.config.speculation_inline || ps.id != kGlobalProcessSetId ||
      DeviceWatchdog::OnWatchdogThread()) {
    return false;
  }
  Driving& d = driving();
  std::unique_lock<std::mutex> drive(d.mu, std::try_to_lock);
  if (!drive.owns_lock()) return false;
  if (!d.open || d.inline_stop || device_stop().requested || st.shutdown.requested ||
      !ps.controller->speculating() ||
      !d.ran_in_step || Clock::now() - d.last_ran > kInlineGap ||
      st.process_sets.Count() != 1) {
    return false;
  }
  Reused<Deferred> done;
  Status why;
  bool broken = false;
  int executed = 0;
  bool ok;
  {
    DeferCompletions defer(&*done);
    t_driving = true;
    Clock::duration negotiation{};
    ok = RunLoopOnce(&why, &broken, &executed, &negotiation);
    NoteCycle(executed, negotiation);
    t_driving = false;
    if (!ok) {
      // The background thread stops the job, as if its own cycle had failed.
      d.inline_stop = true;
      d.inline_why = why;
      d.inline_broken = broken;
    } else {
      st.speculation.inline_responses += executed;
    }
  }
  // After a fallback the background thread negotiates what was held.
  const bool still = ps.controller->speculating();
  drive.unlock();
  RunDeferred(&*done);
  return ok && executed > 0 && still;
}

// The cycle: negotiate, run what is ready, then wait. A submission wakes the
// thread at once, so an idle job answers a new collective without waiting
// for a tick. Otherwise it waits TFRING_CYCLE_TIME while collectives are
// pending (other ranks may not have submitted them yet), and backs off to
// kIdleCap when there is nothing at all, so an idle job costs almost no CPU.
void BackgroundLoop() {
  GlobalState& st = state();
  Driving& d = driving();
  Wakeup& w = wakeup();
  // A name in /proc/<pid>/task/*/comm, so profiles (benchmarks/training.py
  // --profile, perf, top -H) can tell this thread's CPU from TF's.
  pthread_setname_np(pthread_self(), "tfring-bg");
  using Clock = std::chrono::steady_clock;
  auto cycle_now = [&] {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(st.cycle_time_ms.load()));
  };
  auto idle_wait = cycle_now();
  auto last_stall_warning = Clock::now();
  Status why;
  bool broken = false;
  // Eager polling only pays while the ranks run in step: then a peer answers
  // within microseconds. A round that waited long (a peer still computing)
  // or that had nothing to do (this rank idle) says they do not, and an
  // eager wait would then spin for milliseconds on the CPU that the peer's
  // (or this rank's) TF threads need: at np=2 on 2 cores that cost 10-15 ms
  // of CPU per training step (benchmarks/RESULTS.md, the step breakdown).
  bool in_step = false;
  t_driving = true;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    d.open = true;
    d.inline_stop = false;
  }
  {
    DeviceStop& ds = device_stop();
    std::lock_guard<std::mutex> lock(ds.mu);
    ds.requested = false;
    ds.why = Status::OK();
  }
  while (true) {
    int executed = 0;
    bool pending = false, pending_after = false, go_on = true;
    Clock::duration negotiation{};
    Reused<Deferred> done;
    {
      // The controllers are read and driven under driving().mu only.
      std::lock_guard<std::mutex> lock(d.mu);
      DeferCompletions defer(&*done);
      go_on = !d.inline_stop && !device_stop().requested;
      if (d.inline_stop) {
        why = d.inline_why;
        broken = d.inline_broken;
      } else if (!go_on) {
        // A peer died under device work (the watchdog): communication broke.
        std::lock_guard<std::mutex> stop(device_stop().mu);
        why = device_stop().why;
        broken = true;
      } else {
        pending = HasPendingWork();
        SetUrgentWaits(pending && in_step);
        go_on = RunLoopOnce(&why, &broken, &executed, &negotiation);
        NoteCycle(executed, negotiation);
      }
      if (go_on) {
        CheckForStalls(&last_stall_warning);
        pending_after = HasPendingWork();
      } else {
        // From here on no submitting thread touches the sets (they go below).
        d.open = false;
      }
    }
    RunDeferred(&*done);
    if (!go_on) break;
    in_step = pending && negotiation < kInStepRound;
    const Clock::duration cycle = cycle_now();
    const auto idle_cap = std::max<Clock::duration>(cycle, std::chrono::milliseconds(20));
    // Collectives a device runs complete from the watchdog, and whatever a
    // caller submits next wakes this thread: a cycle is only for what other
    // ranks may not have submitted yet (or for an input whose producer the
    // device cannot wait for).
    Clock::duration wait = cycle;
    if (executed == 0 && !pending_after) {
      idle_wait = std::min<Clock::duration>(idle_wait * 2, idle_cap);
      wait = idle_wait;
    } else {
      idle_wait = cycle;
    }
    std::unique_lock<std::mutex> lock(w.mu);
    w.cv.wait_for(lock, wait, [&] { return w.wake; });
    w.wake = false;
  }
  {
    std::lock_guard<std::mutex> lock(st.gate.mu);
    st.gate.stopped = true;
    st.gate.stopped_status = why;
  }
  // A GPU collective waiting for a dead peer never ends by itself: abort the
  // GPU planes' pending work so that the drain below sees it end.
  if (broken) AbortGpuWork(why.message());
  for (const auto& ps : st.process_sets.All()) {
    // Outputs a device is still writing are handed back only once it is
    // done: the watchdog completes them, or fails them at the deadline.
    Watchdog().Drain(ps.get(), kDrainSeconds, why);
    ps->queue.FailAll(why);
  }
  // The job's peers and hooks go with it (the next init arms it again).
  Watchdog().Arm({});
  st.timeline.Stop();
  const bool can_restart = st.backend && st.backend->can_restart_after_failure();
  if (broken) {
    st.broken_can_restart = can_restart;
    st.broken_backend = st.backend ? st.backend->name() : "";
  }
  if (broken && !can_restart) {
    // Operations may still be pending on these communicators and a peer is
    // gone: with a transport that cannot recover (MPI), freeing them could
    // block. They are left to the process's end. A restartable transport
    // tears its connections down, which is what lets it start again.
    static auto* abandoned = new std::vector<std::shared_ptr<void>>();
    for (const auto& ps : st.process_sets.All()) abandoned->push_back(ps);
    abandoned->push_back(std::shared_ptr<Backend>(st.backend.release()));
  }
  // Free communicators on this thread, which is the one that used them.
  st.process_sets.Clear();
  st.backend.reset();
  st.comm_broken = broken;
  TFRING_LOG(DEBUG) << "background thread finished: " << why.message();
}

}  // namespace tfring
