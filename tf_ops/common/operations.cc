#include "operations.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <unistd.h>

#include "logging.h"
#include "ops/data_plane_selector.h"
#include "parameter_manager.h"
#include "process_set.h"
#include "timeline.h"
#include "transport/communicator.h"

namespace tfring {

const char* const kJoinTensorName = "__tfring_join__";

namespace {

struct Topology {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  bool homogeneous = true;
};

struct GlobalState {
  std::mutex lifecycle_mu;  // init/shutdown transitions
  std::atomic<bool> running{false};
  std::atomic<bool> shutdown_requested{false};
  // Why this rank asks the job to stop; guarded by reason_mu.
  std::mutex reason_mu;
  std::string shutdown_reason;
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
  bool wake = false;

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

// Whether this thread already drives (holds drive_mu): the background thread,
// or a submitting thread whose completion callback submits again inline.
thread_local bool t_driving = false;


// Never destroyed: kernels may still hold callbacks into the core while the
// process exits, and static destruction order is not ours to control.
GlobalState& state() {
  static GlobalState* s = new GlobalState();
  return *s;
}

void WakeBackground() {
  GlobalState& st = state();
  {
    std::lock_guard<std::mutex> lock(st.wake_mu);
    st.wake = true;
  }
  st.wake_cv.notify_one();
}

// Completions of a cycle, handed to their callbacks once the driving thread
// has let go of drive_mu: a callback makes TF start the op that consumes the
// result, which submits at once, and that submission should find nobody
// driving, so that it runs its collective itself (DriveInline) rather than
// hand it to the background thread.
struct Deferred {
  DoneCallback callback;
  Status status;
  int32_t result;
};
thread_local std::vector<Deferred>* t_deferred = nullptr;

class DeferCompletions {
 public:
  explicit DeferCompletions(std::vector<Deferred>* into) : prev_(t_deferred) { t_deferred = into; }
  ~DeferCompletions() { t_deferred = prev_; }

 private:
  std::vector<Deferred>* prev_;
};

void RunDeferred(std::vector<Deferred>* list) {
  for (auto& d : *list) d.callback(d.status, d.result);
  list->clear();
}

void Complete(TensorTableEntry& e, const Status& s, int32_t result = -1) {
  state().timeline.End(e.name);
  if (!e.callback) return;
  if (t_deferred) {
    t_deferred->push_back({std::move(e.callback), s, result});
    return;
  }
  e.callback(s, result);
}

using Clock = std::chrono::steady_clock;

// Records one phase of running `names` on the timeline, e.g. "MPI_ALLREDUCE"
// (the plane that ran it, then the collective).
void Phase(const std::vector<std::string>& names, const std::string& what, Clock::time_point start) {
  Timeline& t = state().timeline;
  if (!t.enabled()) return;
  for (const auto& name : names) t.Activity(name, what, start);
}

std::string PlanePhase(const DataPlane& plane, CollectiveType type) {
  return std::string(plane.last_used()) + "_" + CollectiveName(type);
}

// --- Executing responses -------------------------------------------------
//
// Each Perform* starts one negotiated response: it issues every data-plane
// call of the response before returning, so each plane sees the same order
// on every rank. A device may finish the work later; its tensors then
// complete from the set's in-flight list (in_flight.h).

// Waits at shutdown for collectives a device is still running.
constexpr double kDrainSeconds = 10.0;
// A negotiation round at least this long means the ranks are out of step.
constexpr std::chrono::microseconds kInStepRound{500};
// A submitting thread runs a speculated response itself only this soon
// after the last one ran in step (DriveInline).
constexpr std::chrono::microseconds kInlineGap{500};
// How soon the loop looks again at collectives a device is running.
constexpr std::chrono::microseconds kInFlightPoll{100};

// Completes `entries` with the run's verdict now, or once the device has
// finished. `keep` (scratch outputs) lives until then; a failed `alloc`
// overrides a successful run.
void CompleteWhenDone(ProcessSet& ps, std::vector<TensorTableEntry> entries, RunResult run,
                      Status alloc = Status::OK(), std::shared_ptr<void> keep = nullptr) {
  if (!run.status.in_progress()) {
    const Status s = alloc.ok() ? run.status : alloc;
    for (auto& e : entries) Complete(e, s);
    return;
  }
  auto held = std::make_shared<std::vector<TensorTableEntry>>(std::move(entries));
  ps.in_flight.Add(std::move(run.pending), [held, alloc, keep](const Status& s) {
    for (auto& e : *held) Complete(e, alloc.ok() ? s : alloc);
  });
}

// Completes those of `names` this rank has queued with `s`.
void CompleteQueued(ProcessSet& ps, const std::vector<std::string>& names, const Status& s) {
  for (const auto& name : names) {
    TensorTableEntry e;
    if (ps.queue.Take(name, &e)) Complete(e, s);
  }
}

// The plane and executor for a collective of `bytes` on `device`.
Status Route(ProcessSet& ps, CollectiveType type, int32_t device, int64_t bytes, DataPlane** plane,
             Executor** executor) {
  *plane = ps.data_plane->Select(type, device, bytes);
  return ps.executors.Get(device, (*plane)->on_gpu(), executor);
}

// Collectives other than the reductions have no executor steps yet: their
// plane reads and writes the tensors directly, so it must work in the
// tensors' memory. Host staging for them is still to come.
Status CheckDirect(const DataPlane& plane, int32_t device, CollectiveType type) {
  if (IsGpuDevice(device) && !plane.on_gpu()) {
    return Status::InvalidArgument(std::string("tfring: ") + CollectiveName(type) +
                                   " of tensors on " + DeviceName(device) +
                                   " needs a GPU data plane; host staging only covers "
                                   "allreduce and reducescatter so far");
  }
  return Status::OK();
}

int64_t TotalBytes(const Response& r) {
  int64_t n = 0;
  for (int64_t c : r.tensor_sizes) n += c;
  return n * DataTypeSize(r.dtype);
}

void PerformAllreduce(ProcessSet& ps, const Response& r) {
  const size_t n = r.tensor_names.size();
  std::vector<TensorTableEntry> mine;
  std::vector<ReduceSlot> slots(n);
  for (size_t i = 0; i < n; ++i) {
    slots[i].count = r.tensor_sizes[i];
    TensorTableEntry e;
    // A rank that has joined has no entry: its slot stays empty (zeros).
    if (!ps.queue.Take(r.tensor_names[i], &e)) continue;
    slots[i].input = e.input;
    slots[i].output = e.output;
    mine.push_back(std::move(e));
  }
  const int32_t device = r.device_of(ps.rank);
  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  RunResult run;
  run.status = Route(ps, CollectiveType::ALLREDUCE, device, TotalBytes(r), &plane, &executor);
  if (run.status.ok() && r.reduce_op == ReduceOp::ADASUM && !IsGpuDevice(device)) {
    // Only some host planes implement Adasum: the selector, used as a plane,
    // sends it to one that does.
    plane = ps.data_plane.get();
  }
  if (run.status.ok()) {
    auto phase = [&r](const std::string& what, Clock::time_point start) {
      Phase(r.tensor_names, what, start);
    };
    run = RunAllreduce(*executor, *plane, slots, r.dtype, r.reduce_op, r.prescale_factor,
                       r.postscale_factor, ps.size(), phase);
  }
  CompleteWhenDone(ps, std::move(mine), std::move(run));
}

// Allocates the entry's output; if that fails the rank still takes part in
// the collective (through `scratch`) so the other ranks are not left waiting.
// (Host memory: GPU outputs will need device scratch from their executor.)
void* AllocateOrScratch(TensorTableEntry& e, const TensorShape& shape,
                        std::shared_ptr<std::vector<char>>* scratch, Status* s) {
  void* out = nullptr;
  *s = e.allocate_output ? e.allocate_output(shape, &out)
                         : Status::Unknown("tfring: no output allocator for '" + e.name + "'");
  if (s->ok()) return out;
  *scratch = std::make_shared<std::vector<char>>(
      std::max<int64_t>(1, NumElements(shape) * DataTypeSize(e.dtype)));
  return (*scratch)->data();
}

int64_t RowElements(const TensorShape& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

void PerformAllgather(ProcessSet& ps, const Response& r) {
  TensorTableEntry e;
  if (!ps.queue.Take(r.tensor_names[0], &e)) return;
  const int64_t row_bytes = RowElements(e.shape) * DataTypeSize(e.dtype);
  TensorShape out_shape = e.shape;
  out_shape[0] = 0;
  std::vector<int64_t> recv_bytes(ps.size());
  int64_t total = 0;
  for (int i = 0; i < ps.size(); ++i) {
    out_shape[0] += r.tensor_sizes[i];
    recv_bytes[i] = r.tensor_sizes[i] * row_bytes;
    total += recv_bytes[i];
  }
  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  Status s = Route(ps, CollectiveType::ALLGATHER, e.device, total, &plane, &executor);
  if (s.ok()) s = CheckDirect(*plane, e.device, CollectiveType::ALLGATHER);
  if (!s.ok()) return Complete(e, s);
  std::shared_ptr<std::vector<char>> scratch;
  Status alloc;
  void* out = AllocateOrScratch(e, out_shape, &scratch, &alloc);
  const auto start = Clock::now();
  s = plane->Allgather(e.input, out, recv_bytes);
  Phase(r.tensor_names, PlanePhase(*plane, CollectiveType::ALLGATHER), start);
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(e));
  CompleteWhenDone(ps, std::move(entries), Settle(*executor, s, s.in_progress()), alloc, scratch);
}

void PerformBroadcast(ProcessSet& ps, const Response& r) {
  TensorTableEntry e;
  if (!ps.queue.Take(r.tensor_names[0], &e)) return;
  const int64_t bytes = e.input_bytes();
  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  Status s = Route(ps, CollectiveType::BROADCAST, e.device, bytes, &plane, &executor);
  if (s.ok()) s = CheckDirect(*plane, e.device, CollectiveType::BROADCAST);
  if (!s.ok()) return Complete(e, s);
  bool queued = false;
  const bool fused = plane->broadcasts_out_of_place();
  if (!fused && ps.rank == r.root_rank && e.output != e.input) {
    s = executor->Copy(e.output, e.input, bytes);
    queued |= s.in_progress();
  }
  const auto start = Clock::now();
  if (s.ok() || s.in_progress()) {
    s = fused ? plane->BroadcastOutOfPlace(e.input, e.output, bytes, r.root_rank)
              : plane->Broadcast(e.output, bytes, r.root_rank);
    queued |= s.in_progress();
  }
  Phase(r.tensor_names, PlanePhase(*plane, CollectiveType::BROADCAST), start);
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(e));
  CompleteWhenDone(ps, std::move(entries), Settle(*executor, s, queued));
}

void PerformAlltoall(ProcessSet& ps, const Response& r) {
  TensorTableEntry e;
  if (!ps.queue.Take(r.tensor_names[0], &e)) return;
  const int n = ps.size();
  const int64_t row_bytes = RowElements(e.shape) * DataTypeSize(e.dtype);
  std::vector<int64_t> send(n), recv(n), received_splits(n);
  TensorShape out_shape = e.shape;
  out_shape[0] = 0;
  int64_t total = 0;
  for (int j = 0; j < n; ++j) {
    send[j] = r.tensor_sizes[ps.rank * n + j] * row_bytes;
    received_splits[j] = r.tensor_sizes[j * n + ps.rank];
    recv[j] = received_splits[j] * row_bytes;
    out_shape[0] += received_splits[j];
    total += send[j];
  }
  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  Status s = Route(ps, CollectiveType::ALLTOALL, e.device, total, &plane, &executor);
  if (s.ok()) s = CheckDirect(*plane, e.device, CollectiveType::ALLTOALL);
  if (!s.ok()) return Complete(e, s);
  std::shared_ptr<std::vector<char>> scratch;
  Status alloc;
  void* out = AllocateOrScratch(e, out_shape, &scratch, &alloc);
  const auto start = Clock::now();
  s = plane->Alltoall(e.input, send, out, recv);
  Phase(r.tensor_names, PlanePhase(*plane, CollectiveType::ALLTOALL), start);
  // The splits are known now; the output's bytes only once the device is done.
  if ((s.ok() || s.in_progress()) && alloc.ok() && e.set_received_splits) {
    e.set_received_splits(received_splits);
  }
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(e));
  CompleteWhenDone(ps, std::move(entries), Settle(*executor, s, s.in_progress()), alloc, scratch);
}

void PerformReducescatter(ProcessSet& ps, const Response& r) {
  TensorTableEntry e;
  if (!ps.queue.Take(r.tensor_names[0], &e)) return;
  const int n = ps.size();
  const int64_t rows = e.shape[0], row_elems = RowElements(e.shape);
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = (rows / n + (i < rows % n ? 1 : 0)) * row_elems;
  TensorShape out_shape = e.shape;
  out_shape[0] = counts[ps.rank] / std::max<int64_t>(row_elems, 1);
  if (row_elems == 0) out_shape[0] = rows / n + (ps.rank < rows % n ? 1 : 0);

  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  Status s = Route(ps, CollectiveType::REDUCESCATTER, e.device, e.input_bytes(), &plane, &executor);
  if (!s.ok()) return Complete(e, s);
  std::shared_ptr<std::vector<char>> scratch;
  Status alloc;
  void* out = AllocateOrScratch(e, out_shape, &scratch, &alloc);
  auto phase = [&r](const std::string& what, Clock::time_point start) {
    Phase(r.tensor_names, what, start);
  };
  RunResult run = RunReducescatter(*executor, *plane, e.input, out, counts, ps.rank, e.dtype,
                                   r.reduce_op, r.prescale_factor, r.postscale_factor, phase);
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(e));
  CompleteWhenDone(ps, std::move(entries), std::move(run), alloc, scratch);
}

void PerformAddProcessSet(ProcessSet& global, const Response& r) {
  TensorTableEntry e;
  const bool have = global.queue.Take(r.tensor_names[0], &e);
  auto set = std::make_shared<ProcessSet>();
  set->id = r.int_result;
  set->ranks.assign(r.ranks.begin(), r.ranks.end());
  // Every rank takes part in creating the communicator, members or not.
  Status s = state().backend->CreateProcessSet(set.get(), state().config);
  if (s.ok() && set->controller) set->controller->set_timeline(&state().timeline);
  if (s.ok()) state().process_sets.Add(set);
  if (have) Complete(e, s, set->id);
}

void PerformRemoveProcessSet(ProcessSet& global, const Response& r) {
  TensorTableEntry e;
  const bool have = global.queue.Take(r.tensor_names[0], &e);
  const int32_t id = static_cast<int32_t>(r.ranks.empty() ? -1 : r.ranks[0]);
  Status s;
  std::shared_ptr<ProcessSet> removed;
  if (id == kGlobalProcessSetId) {
    s = Status::InvalidArgument("tfring: the global process set (id 0) cannot be removed");
  } else if (!(removed = state().process_sets.Remove(id))) {
    s = Status::InvalidArgument("tfring: there is no process set with id " + std::to_string(id));
  } else {
    const Status gone = Status::InvalidArgument(
        "tfring: process set " + std::to_string(id) + " was removed while this collective waited");
    removed->in_flight.Drain(kDrainSeconds, gone);
    removed->queue.FailAll(gone);
  }
  if (have) Complete(e, s);
}

void PerformOperation(ProcessSet& ps, const Response& r) {
  if (r.type == ResponseType::ERROR) {
    return CompleteQueued(ps, r.tensor_names, Status::PreconditionError(r.error_message));
  }
  switch (r.collective) {
    case CollectiveType::ALLREDUCE: PerformAllreduce(ps, r); break;
    case CollectiveType::ALLGATHER: PerformAllgather(ps, r); break;
    case CollectiveType::BROADCAST: PerformBroadcast(ps, r); break;
    case CollectiveType::ALLTOALL: PerformAlltoall(ps, r); break;
    case CollectiveType::REDUCESCATTER: PerformReducescatter(ps, r); break;
    case CollectiveType::ADD_PROCESS_SET: PerformAddProcessSet(ps, r); break;
    case CollectiveType::REMOVE_PROCESS_SET: PerformRemoveProcessSet(ps, r); break;
    case CollectiveType::BARRIER: {
      TensorTableEntry e;
      const bool have = ps.queue.Take(r.tensor_names[0], &e);
      Status s = ps.data_plane->Select(CollectiveType::BARRIER, kCpuDevice, 0)->Barrier();
      if (have) Complete(e, s);
      break;
    }
    case CollectiveType::JOIN: {
      TensorTableEntry e;
      if (ps.queue.Take(kJoinTensorName, &e)) Complete(e, Status::OK(), r.int_result);
      break;
    }
  }
}

// A speculated allreduce whose divergence flag rides in the fusion buffer
// (Speculation::FlagRidesAlong); PerformSpeculative's contract.
SpeculationOutcome PerformSpeculativeAllreduce(ProcessSet& ps, const Response& r) {
  const size_t n = r.tensor_names.size();
  std::vector<ReduceSlot> slots(n);
  for (size_t i = 0; i < n; ++i) {
    slots[i].count = r.tensor_sizes[i];
    // A rank that diverged may lack some of them: it sends zeros anyway.
    if (!r.diverged) ps.queue.Peek(r.tensor_names[i], &slots[i].input, &slots[i].output);
  }
  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  bool agreed = false;
  Status s = Route(ps, CollectiveType::ALLREDUCE, kCpuDevice, TotalBytes(r), &plane, &executor);
  if (s.ok()) {
    auto phase = [&r](const std::string& what, Clock::time_point start) {
      Phase(r.tensor_names, what, start);
    };
    s = RunSpeculativeAllreduce(*executor, *plane, slots, r.dtype, r.reduce_op, r.prescale_factor,
                                r.postscale_factor, ps.size(), r.diverged, &agreed, phase);
  }
  if (s.ok() && !agreed) return SpeculationOutcome::FLAGGED;
  // Agreed, or the plane failed: then, as on the normal path, the tensors
  // get its error.
  CompleteQueued(ps, r.tensor_names, s);
  return s.ok() ? SpeculationOutcome::AGREED : SpeculationOutcome::FAILED;
}

// Reduces the divergence flag on its own (a one-element allreduce on the
// plane a tiny host allreduce takes): `agreed` is true when no rank raised it.
Status AgreeOnSchedule(ProcessSet& ps, const Response& r, bool* agreed) {
  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  TFRING_RETURN_IF_ERROR(
      Route(ps, CollectiveType::ALLREDUCE, kCpuDevice, sizeof(float), &plane, &executor));
  float flag = r.diverged ? 1.0f : 0.0f;
  const auto start = Clock::now();
  Status s = plane->Allreduce(&flag, &flag, 1, DataType::FLOAT32, ReduceOp::SUM);
  Phase(r.tensor_names, "SPECULATION_FLAG", start);
  if (s.in_progress()) return Status::Unknown("tfring: a speculation flag was queued");
  TFRING_RETURN_IF_ERROR(s);
  *agreed = flag == 0.0f;
  return Status::OK();
}

// Runs a response the controller scheduled without negotiation. Returns
// FLAGGED, having written and completed nothing, when some rank raised the
// divergence flag: the tensors stay queued and are negotiated again. Every
// rank gets the same answer from the same reduced flag. FAILED: the plane
// failed before the flag was known, and the tensors got its error. Adds to
// `waited` the time until the flag was known, which stands for the
// negotiation round that speculation skipped (when the flag rides along,
// the whole run).
SpeculationOutcome PerformSpeculative(ProcessSet& ps, const Response& r,
                                      Clock::duration* waited) {
  const auto start = Clock::now();
  if (Speculation::FlagRidesAlong(r)) {
    const SpeculationOutcome outcome = PerformSpeculativeAllreduce(ps, r);
    *waited += Clock::now() - start;
    return outcome;
  }
  bool agreed = false;
  const Status s = AgreeOnSchedule(ps, r, &agreed);
  *waited += Clock::now() - start;
  if (s.ok() && !agreed) return SpeculationOutcome::FLAGGED;
  if (s.ok()) {
    // Every rank agreed: the collective is the negotiated one it was cached
    // as. (Should its plane fail, the next flag fails on it too.)
    PerformOperation(ps, r);
    return SpeculationOutcome::AGREED;
  }
  // As on the normal path the tensors get the plane's error.
  CompleteQueued(ps, r.tensor_names, s);
  return SpeculationOutcome::FAILED;
}

// --- The background loop ---------------------------------------------------

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
  for (const auto& ps : st.process_sets.All()) {
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
  for (const auto& ps : st.process_sets.All()) {
    // A set removed earlier in this round is gone on every rank alike.
    if (!ps->included() || !st.process_sets.Get(ps->id)) continue;
    // Collectives the device has finished since the last look complete first.
    *executed += ps->in_flight.Poll();
    RequestList mine;
    ps->queue.PopRequests(&mine.requests);
    if (ps->id == kGlobalProcessSetId && st.shutdown_requested) {
      std::lock_guard<std::mutex> lock(st.reason_mu);
      mine.shutdown = true;
      mine.shutdown_reason = st.shutdown_reason;
    }
    ResponseList responses;
    // Speculation needs the global set alone: a rank waiting inside a
    // speculative collective must not be needed by another set's round.
    ps->controller->set_speculation_allowed(st.config.speculation &&
                                            ps->id == kGlobalProcessSetId &&
                                            st.process_sets.All().size() == 1);
    const auto round_start = Clock::now();
    Status s = ps->controller->ComputeResponseList(mine, &responses);
    if (ps->id == kGlobalProcessSetId) *negotiation = Clock::now() - round_start;
    if (!s.ok()) {
      *broken = true;
      *why = s.message().rfind("tfring stopped", 0) == 0
                 ? s
                 : Status::Aborted("tfring stopped after a communication failure in process "
                                   "set " + std::to_string(ps->id) + ": " + s.message());
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
    *executed += ps->in_flight.Poll();
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
      std::lock_guard<std::mutex> lock(st.spec_mu);
      st.spec_stats.entered = c.entered;
      st.spec_stats.responses = c.responses;
      st.spec_stats.fallbacks = c.fallbacks;
      st.spec_stats.failures = c.failures;
    }
    if (ps->id == kGlobalProcessSetId && responses.shutdown) {
      *why = Status::Aborted("tfring has been shut down: " + responses.shutdown_reason +
                             ". Collectives can no longer run in this job.");
      return false;
    }
  }
  return true;
}

void RequestShutdown(const std::string& reason) {
  GlobalState& st = state();
  {
    std::lock_guard<std::mutex> lock(st.reason_mu);
    if (st.shutdown_requested) return;
    st.shutdown_reason = reason;
  }
  st.shutdown_requested = true;
  WakeBackground();
}

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
  for (const auto& ps : st.process_sets.All()) {
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
        RequestShutdown("a stall: " + what + " (TFRING_STALL_SHUTDOWN_TIME_SECONDS=" +
                        std::to_string(static_cast<int>(c.stall_shutdown_time_s)) + ")");
      }
    }
  }
  if (warn_due) *last_warning = std::chrono::steady_clock::now();
}

// True while this rank has collectives submitted and not yet completed.
bool HasPendingWork() {
  for (const auto& ps : state().process_sets.All()) {
    if (!ps->included()) continue;
    if (ps->queue.size() > 0 || ps->controller->HasPendingHits() || !ps->in_flight.empty())
      return true;
  }
  return false;
}

// True while a device is still running collectives this rank started.
bool HasInFlight() {
  for (const auto& ps : state().process_sets.All()) {
    if (ps->included() && !ps->in_flight.empty()) return true;
  }
  return false;
}

// Under drive_mu, after a cycle that ran `executed` responses of which the
// global set's took `negotiation` (for speculated ones: waiting for peers).
void NoteCycle(int executed, Clock::duration negotiation) {
  GlobalState& st = state();
  if (executed == 0) return;
  st.last_ran = Clock::now();
  st.ran_in_step = negotiation < kInStepRound;
}

// Runs the global set's next speculated responses on the thread that just
// submitted a tensor, when no other thread drives: in the steady state that
// saves two thread hand-offs per collective (waking the background thread,
// and TF waking another thread for the op that consumes the result, since a
// callback run on a TF thread queues that op on the same thread), each a
// sleep and a wake-up of tens of microseconds. The cycle is the background
// thread's own (RunLoopOnce) under drive_mu, so every rank still runs the
// same responses in the same order. Returns false when the background
// thread must take over: nothing was tried (not speculating, another thread
// drives, shutting down, TFRING_SPECULATION_INLINE=0), the cycle ran
// nothing (the next response needs tensors not yet submitted), or it ended
// speculation (a fallback: what was held is negotiated again) or the job.
//
// Only while the ranks run in step, as in a chain of collectives: the last
// responses ran less than kInlineGap ago and found their peers there.
// Otherwise a peer may still be computing (the first gradient of a training
// step), and the submitting thread, one of TF's compute threads, would wait
// for it instead of computing; the background thread waits then.
bool DriveInline(ProcessSet& ps) {
  GlobalState& st = state();
  if (t_driving || !st.config.speculation_inline || ps.id != kGlobalProcessSetId) return false;
  std::unique_lock<std::mutex> drive(st.drive_mu, std::try_to_lock);
  if (!drive.owns_lock()) return false;
  if (!st.drive_open || st.inline_stop || st.shutdown_requested || !ps.controller->speculating() ||
      !st.ran_in_step || Clock::now() - st.last_ran > kInlineGap ||
      st.process_sets.All().size() != 1) {
    return false;
  }
  std::vector<Deferred> done;
  Status why;
  bool broken = false;
  int executed = 0;
  bool ok;
  {
    DeferCompletions defer(&done);
    t_driving = true;
    Clock::duration negotiation{};
    ok = RunLoopOnce(&why, &broken, &executed, &negotiation);
    NoteCycle(executed, negotiation);
    t_driving = false;
    if (!ok) {
      // The background thread stops the job, as if its own cycle had failed.
      st.inline_stop = true;
      st.inline_why = why;
      st.inline_broken = broken;
    } else {
      st.inline_responses += executed;
    }
  }
  // After a fallback the background thread negotiates what was held.
  const bool still = ps.controller->speculating();
  drive.unlock();
  RunDeferred(&done);
  return ok && executed > 0 && still;
}

// The cycle: negotiate, run what is ready, then wait. A submission wakes the
// thread at once, so an idle job answers a new collective without waiting
// for a tick. Otherwise it waits TFRING_CYCLE_TIME while collectives are
// pending (other ranks may not have submitted them yet), and backs off to
// kIdleCap when there is nothing at all, so an idle job costs almost no CPU.
void BackgroundLoop() {
  GlobalState& st = state();
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
    std::lock_guard<std::mutex> drive(st.drive_mu);
    st.drive_open = true;
    st.inline_stop = false;
  }
  while (true) {
    int executed = 0;
    bool pending = false, pending_after = false, go_on = true;
    Clock::duration negotiation{};
    std::vector<Deferred> done;
    {
      // The controllers are read and driven under drive_mu only.
      std::lock_guard<std::mutex> drive(st.drive_mu);
      DeferCompletions defer(&done);
      go_on = !st.inline_stop;
      if (!go_on) {
        why = st.inline_why;
        broken = st.inline_broken;
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
        st.drive_open = false;
      }
    }
    RunDeferred(&done);
    if (!go_on) break;
    in_step = pending && negotiation < kInStepRound;
    const Clock::duration cycle = cycle_now();
    const auto idle_cap = std::max<Clock::duration>(cycle, std::chrono::milliseconds(20));
    Clock::duration wait = cycle;
    if (HasInFlight()) {
      // A device may finish any moment: look again soon, not at the next tick.
      wait = std::min<Clock::duration>(cycle, kInFlightPoll);
      idle_wait = cycle;
    } else if (executed == 0 && !pending_after) {
      idle_wait = std::min<Clock::duration>(idle_wait * 2, idle_cap);
      wait = idle_wait;
    } else {
      idle_wait = cycle;
    }
    std::unique_lock<std::mutex> lock(st.wake_mu);
    st.wake_cv.wait_for(lock, wait, [&] { return st.wake; });
    st.wake = false;
  }
  {
    std::lock_guard<std::mutex> lock(st.enqueue_mu);
    st.stopped = true;
    st.stopped_status = why;
  }
  for (const auto& ps : st.process_sets.All()) {
    // Outputs a device is still writing are handed back only once it is done.
    ps->in_flight.Drain(kDrainSeconds, why);
    ps->queue.FailAll(why);
  }
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

// What each rank tells the others at init.
struct RankInfo {
  static constexpr int kHostBytes = 256;
  char host[kHostBytes];       // for topology: TFRING_HOSTNAME if set
  char real_host[kHostBytes];  // for the peer monitor
  int64_t pid;
};

Status ComputeTopology(ProcessSet& global, const Config& config, Topology* topo,
                       std::vector<PeerMonitor::Peer>* peers, std::string* my_real_host,
                       std::vector<std::string>* host_names) {
  RankInfo mine;
  std::memset(&mine, 0, sizeof(mine));
  gethostname(mine.real_host, RankInfo::kHostBytes - 1);
  std::strncpy(mine.host, config.HostnameFor(global.rank, mine.real_host).c_str(),
               RankInfo::kHostBytes - 1);
  mine.pid = getpid();
  const int n = global.size();
  std::vector<RankInfo> all(n);
  TFRING_RETURN_IF_ERROR(global.data_plane->Allgather(
      &mine, all.data(), std::vector<int64_t>(n, static_cast<int64_t>(sizeof(RankInfo)))));
  std::vector<std::string> hosts(n);
  for (int r = 0; r < n; ++r) {
    hosts[r] = std::string(all[r].host);
    peers->push_back({r, static_cast<int>(all[r].pid), std::string(all[r].real_host)});
  }
  *my_real_host = mine.real_host;
  *host_names = hosts;
  topo->rank = global.rank;
  topo->size = n;
  std::vector<int> local_rank(n), local_size(n);
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      if (hosts[q] != hosts[r]) continue;
      ++local_size[r];
      if (q < r) ++local_rank[r];
    }
  }
  topo->local_rank = local_rank[topo->rank];
  topo->local_size = local_size[topo->rank];
  topo->cross_rank = 0;
  topo->cross_size = 0;
  for (int q = 0; q < n; ++q) {
    if (local_rank[q] != topo->local_rank) continue;
    ++topo->cross_size;
    if (q < topo->rank) ++topo->cross_rank;
  }
  topo->homogeneous = std::all_of(local_size.begin(), local_size.end(),
                                  [&](int s) { return s == local_size[0]; });
  return Status::OK();
}

}  // namespace

namespace {

// Under lifecycle_mu: whether tfring runs, else whether it may start again.
Status CheckCanStartLocked(bool* running) {
  GlobalState& st = state();
  {
    std::lock_guard<std::mutex> elock(st.enqueue_mu);
    *running = st.running && !st.stopped;
    if (*running) return Status::OK();
  }
  // The previous job ended (shutdown() here, or another rank stopped it).
  if (st.background.joinable()) st.background.join();
  if (st.comm_broken && !st.broken_can_restart) {
    return Status::Aborted("tfring cannot start again in this process: communication broke "
                           "down earlier, and the " + st.broken_backend +
                           " transport cannot recover from that (" +
                           st.stopped_status.message() + ")");
  }
  return Status::OK();
}

}  // namespace

Status CheckCanStart(bool* running) {
  GlobalState& st = state();
  std::lock_guard<std::mutex> lock(st.lifecycle_mu);
  return CheckCanStartLocked(running);
}

Status Initialize(std::unique_ptr<Backend> backend, const Config& config) {
  GlobalState& st = state();
  std::lock_guard<std::mutex> lock(st.lifecycle_mu);
  bool running = false;
  TFRING_RETURN_IF_ERROR(CheckCanStartLocked(&running));
  if (running) return Status::OK();
  if (!backend) return Status::InvalidArgument("tfring: Initialize() needs a backend");

  st.config = config;
  st.shutdown_requested = false;
  st.shutdown_reason.clear();
  SetLogging(st.config.log_level, st.config.log_timestamps, backend->rank());
  // A first global set, on the fallback plane only, learns the topology; the
  // real one is then built knowing which ranks share a host (for shared
  // memory and the cross-host planes).
  auto bootstrap = std::make_shared<ProcessSet>();
  for (int r = 0; r < backend->size(); ++r) bootstrap->ranks.push_back(r);
  TFRING_RETURN_IF_ERROR(backend->CreateProcessSet(bootstrap.get(), st.config));
  Topology topo;
  std::vector<PeerMonitor::Peer> peers;
  std::string real_host;
  std::vector<std::string> hosts;
  TFRING_RETURN_IF_ERROR(
      ComputeTopology(*bootstrap, st.config, &topo, &peers, &real_host, &hosts));
  backend->set_peer_monitor(std::make_shared<PeerMonitor>(topo.rank, real_host, peers));
  backend->set_hosts(hosts);
  auto global = std::make_shared<ProcessSet>();
  global->id = kGlobalProcessSetId;
  global->ranks = bootstrap->ranks;
  TFRING_RETURN_IF_ERROR(backend->CreateProcessSet(global.get(), st.config));
  bootstrap.reset();

  if (topo.rank == 0 && !st.config.timeline_path.empty()) {
    TFRING_RETURN_IF_ERROR(st.timeline.Start(st.config.timeline_path, st.config.timeline_mark_cycles));
  }
  global->controller->set_timeline(&st.timeline);
  st.cycle_time_ms = st.config.cycle_time_ms;
  st.fusion_threshold_bytes = st.config.fusion_threshold_bytes;
  st.shm_min_bytes = st.config.shm_min_bytes;
  st.tuner.reset();
  if (topo.rank == 0 && st.config.autotune) {
    TunableParams initial{st.config.fusion_threshold_bytes, st.config.cycle_time_ms,
                          st.config.shm_min_bytes};
    st.tuner.reset(new ParameterManager(st.config, initial));
  }
  st.topo = topo;
  // Communication works again (a restartable backend after a failure).
  st.comm_broken = false;
  st.broken_can_restart = false;
  st.broken_backend.clear();
  st.backend = std::move(backend);
  st.process_sets.Clear();
  st.process_sets.Add(global);
  {
    std::lock_guard<std::mutex> elock(st.enqueue_mu);
    st.stopped = false;
    st.stopped_status = Status::OK();
  }
  st.ever_initialized = true;
  st.running = true;
  st.background = std::thread(BackgroundLoop);
  TFRING_LOG(DEBUG) << "initialised over " << st.backend->name() << ": size " << topo.size
                    << ", local rank " << topo.local_rank << " of " << topo.local_size;
  return Status::OK();
}

Status Shutdown(const std::string& reason) {
  GlobalState& st = state();
  std::lock_guard<std::mutex> lock(st.lifecycle_mu);
  if (!st.running) return Status::OK();
  RequestShutdown("rank " + std::to_string(st.topo.rank) +
                  (reason.empty() ? " called shutdown() (or its script ended)" : " " + reason));
  if (st.background.joinable()) st.background.join();
  {
    std::lock_guard<std::mutex> elock(st.enqueue_mu);
    st.stopped_status = Status::PreconditionError(
        "tfring has been shut down on this rank (shutdown() was called); call init() to start it "
        "again.");
  }
  st.running = false;
  return Status::OK();
}

bool IsInitialized() {
  GlobalState& st = state();
  std::lock_guard<std::mutex> lock(st.enqueue_mu);
  return st.running && !st.stopped;
}

Status CheckInitialized() {
  GlobalState& st = state();
  std::lock_guard<std::mutex> lock(st.enqueue_mu);
  if (!st.ever_initialized) {
    return Status::PreconditionError("tfring has not been initialized; use hvd.init().");
  }
  if (st.stopped) return st.stopped_status;
  return Status::OK();
}

Status CheckTopologyKnown() {
  GlobalState& st = state();
  std::lock_guard<std::mutex> lock(st.enqueue_mu);
  if (!st.ever_initialized) {
    return Status::PreconditionError("tfring has not been initialized; use hvd.init().");
  }
  return Status::OK();
}

int Rank() { return state().topo.rank; }
int Size() { return state().topo.size; }
int LocalRank() { return state().topo.local_rank; }
int LocalSize() { return state().topo.local_size; }
int CrossRank() { return state().topo.cross_rank; }
int CrossSize() { return state().topo.cross_size; }
bool IsHomogeneous() { return state().topo.homogeneous; }
bool CommunicationBroken() { return state().comm_broken; }

bool MPIThreadsSupported() {
  GlobalState& st = state();
  return st.backend && st.backend->threads_supported();
}

namespace {

// An alltoall's rows and splits are this rank's own arguments: checking them
// here fails the call at once with InvalidArgument (as Horovod does), before
// anything is sent, instead of a FailedPrecondition for every rank after
// negotiation. `set_size` is the number of ranks in the process set.
Status CheckAlltoallArguments(const TensorTableEntry& e, int set_size, int rank) {
  if (e.shape.empty()) {
    return Status::InvalidArgument("tfring: alltoall needs a tensor with at least one dimension");
  }
  const std::string quoted = "'" + e.name + "'";
  const int64_t rows = e.shape[0];
  if (e.splits.empty()) {
    if (rows % set_size != 0) {
      return Status::InvalidArgument(
          "ALLTOALL of tensor " + quoted + " without splits needs a first dimension divisible "
          "by the number of ranks (" + std::to_string(set_size) + "), but rank " +
          std::to_string(rank) + " sent shape " + ShapeString(e.shape) + ".");
    }
    return Status::OK();
  }
  int64_t total = 0;
  bool negative = false;
  for (int64_t s : e.splits) {
    total += s;
    negative |= s < 0;
  }
  if (static_cast<int>(e.splits.size()) != set_size || negative || total != rows) {
    return Status::InvalidArgument(
        "Invalid ALLTOALL splits for tensor " + quoted + " on rank " + std::to_string(rank) +
        ": splits " + ShapeString(e.splits) + " must have one non-negative entry per rank (" +
        std::to_string(set_size) + ") adding up to the first dimension " +
        std::to_string(rows) + ".");
  }
  return Status::OK();
}

}  // namespace

Status Enqueue(int32_t process_set_id, TensorTableEntry entry) {
  GlobalState& st = state();
  std::unique_lock<std::mutex> lock(st.enqueue_mu);
  if (!st.ever_initialized) {
    return Status::PreconditionError("tfring has not been initialized; use hvd.init().");
  }
  if (st.stopped) return st.stopped_status;
  auto ps = st.process_sets.Get(process_set_id);
  if (!ps) {
    return Status::InvalidArgument("tfring: there is no process set with id " +
                                   std::to_string(process_set_id) +
                                   " (was it added with add_process_set() on every rank?)");
  }
  if (!ps->included()) {
    std::string ranks;
    for (int r : ps->ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    return Status::InvalidArgument("tfring: rank " + std::to_string(st.topo.rank) +
                                   " is not a member of process set " +
                                   std::to_string(process_set_id) + " (ranks [" + ranks + "])");
  }
  if (entry.type == CollectiveType::ALLTOALL) {
    TFRING_RETURN_IF_ERROR(
        CheckAlltoallArguments(entry, static_cast<int>(ps->ranks.size()), st.topo.rank));
  }
  if (st.timeline.enabled()) st.timeline.NegotiateStart(entry.name, CollectiveName(entry.type));
  // Only host tensors, ready now, can be speculated (Speculation::Eligible).
  const bool may_inline = (entry.type == CollectiveType::ALLREDUCE ||
                           entry.type == CollectiveType::BROADCAST ||
                           entry.type == CollectiveType::ALLGATHER) &&
                          entry.device == kCpuDevice && !entry.ready_event;
  TFRING_RETURN_IF_ERROR(ps->queue.Add(std::move(entry), ps->rank));
  lock.unlock();
  if (!(may_inline && DriveInline(*ps))) WakeBackground();
  return Status::OK();
}

namespace {

Status RunBlocking(TensorTableEntry entry, int32_t* result) {
  auto promise = std::make_shared<std::promise<std::pair<Status, int32_t>>>();
  auto future = promise->get_future();
  entry.callback = [promise](const Status& s, int32_t r) { promise->set_value({s, r}); };
  TFRING_RETURN_IF_ERROR(Enqueue(kGlobalProcessSetId, std::move(entry)));
  auto out = future.get();
  if (result) *result = out.second;
  return out.first;
}

}  // namespace

Status AddProcessSet(const std::vector<int>& ranks, int32_t* id) {
  TensorTableEntry e;
  e.name = "__tfring_add_process_set_" + std::to_string(state().add_counter++);
  e.type = CollectiveType::ADD_PROCESS_SET;
  e.dtype = DataType::UINT8;
  e.splits.assign(ranks.begin(), ranks.end());
  return RunBlocking(std::move(e), id);
}

Status RemoveProcessSet(int32_t id) {
  TensorTableEntry e;
  e.name = "__tfring_remove_process_set_" + std::to_string(state().add_counter++);
  e.type = CollectiveType::REMOVE_PROCESS_SET;
  e.dtype = DataType::UINT8;
  e.splits = {id};
  return RunBlocking(std::move(e), nullptr);
}

Status GetProcessSet(int32_t id, int* rank, std::vector<int>* ranks) {
  TFRING_RETURN_IF_ERROR(CheckInitialized());
  auto ps = state().process_sets.Get(id);
  if (!ps) {
    return Status::InvalidArgument("tfring: there is no process set with id " + std::to_string(id));
  }
  *rank = ps->rank;
  *ranks = ps->ranks;
  return Status::OK();
}

std::vector<int32_t> ProcessSetIds() {
  std::vector<int32_t> ids;
  for (const auto& ps : state().process_sets.All()) ids.push_back(ps->id);
  return ids;
}

RuntimeParams GetRuntimeParams() {
  GlobalState& st = state();
  RuntimeParams p;
  p.fusion_threshold_bytes = st.fusion_threshold_bytes;
  p.cycle_time_ms = st.cycle_time_ms;
  p.shm_min_bytes = st.shm_min_bytes;
  p.autotune_done = st.tuner ? st.tuner->done() && !st.tuner->HasUpdate() : false;
  {
    std::lock_guard<std::mutex> lock(st.spec_mu);
    p.speculation = st.spec_stats;
  }
  p.speculation.inline_responses = st.inline_responses;
  return p;
}

Status StartTimeline(const std::string& path, bool mark_cycles) {
  TFRING_RETURN_IF_ERROR(CheckInitialized());
  if (Rank() != 0) return Status::OK();  // rank 0 writes the timeline
  return state().timeline.Start(path, mark_cycles);
}

void StopTimeline() { state().timeline.Stop(); }

}  // namespace tfring
