#include "execution.h"

#include <algorithm>
#include <memory>

#include "device_watchdog.h"
#include "global_state.h"
#include "operations.h"

namespace tfring {

namespace {

thread_local std::vector<Deferred>* t_deferred = nullptr;

}  // namespace

DeferCompletions::DeferCompletions(std::vector<Deferred>* into) : prev_(t_deferred) {
  t_deferred = into;
}
DeferCompletions::~DeferCompletions() { t_deferred = prev_; }

void RunDeferred(std::vector<Deferred>* list) {
  for (auto& d : *list) d.callback(d.status, d.result);
  list->clear();
}

void Complete(TensorTableEntry& e, const Status& s, int32_t result) {
  state().timeline.End(e.name);
  if (!e.callback) return;
  if (t_deferred) {
    t_deferred->push_back({std::move(e.callback), s, result});
    return;
  }
  e.callback(s, result);
}

void Phase(const std::vector<std::string>& names, const char* what, Clock::time_point start,
           const char* collective) {
  Timeline& t = state().timeline;
  if (!t.enabled()) return;
  const std::string phase = collective ? std::string(what) + "_" + collective : std::string(what);
  for (const auto& name : names) t.Activity(name, phase, start);
}

PhaseFn PhasesOf(const Response& r) {
  if (!state().timeline.enabled()) return PhaseFn();
  // One reference: held inside std::function itself, no allocation.
  return [&r](const std::string& what, Clock::time_point start) {
    Phase(r.tensor_names, what.c_str(), start);
  };
}

void CompleteQueued(ProcessSet& ps, const std::vector<std::string>& names, const Status& s) {
  for (const auto& name : names) {
    TensorTableEntry e;
    if (ps.queue.Take(name, &e)) Complete(e, s);
  }
}

Status Route(ProcessSet& ps, CollectiveType type, int32_t device, int64_t bytes, DataPlane** plane,
             Executor** executor) {
  *plane = ps.data_plane->Select(type, device, bytes);
  TFRING_RETURN_IF_ERROR(ps.executors.Get(device, (*plane)->on_gpu(), executor));
  (*plane)->Bind((*executor)->context());
  return Status::OK();
}

namespace {

// Completes `entries` with the run's verdict now, or once the device has
// finished (the watchdog completes them then, on its thread). `keep`
// (scratch outputs) lives until then; a failure of this rank's own
// (`local`: its input never became ready, its output could not be
// allocated) overrides a successful run.
void CompleteWhenDone(ProcessSet& ps, std::vector<TensorTableEntry> entries, RunResult run,
                      Status local = Status::OK(), std::shared_ptr<void> keep = nullptr) {
  if (!run.status.in_progress()) {
    const Status s = local.ok() ? run.status : local;
    for (auto& e : entries) Complete(e, s);
    return;
  }
  std::shared_ptr<DeviceEvent> done = std::move(run.pending);
  // Before the watchdog may complete them: a binding's stream waits for the
  // fence from now on, and its host need not wait for the callback. Not
  // after a failure, which only the callback carries, nor for a fence no
  // stream can wait for (a failed step's).
  bool told = false;
  if (local.ok() && done && done->waits_on_device()) {
    for (auto& e : entries) {
      if (!e.launched) continue;
      e.launched(done);
      told = true;
    }
  }
  auto held = std::make_shared<std::vector<TensorTableEntry>>(std::move(entries));
  Watchdog().Watch(
      &ps, std::move(done),
      [held, local, keep](const Status& s) {
        for (auto& e : *held) Complete(e, local.ok() ? s : local);
      },
      told);
}

// Holds what `executor` queues next until the entries' inputs are written
// (their ready events). On failure the rank still takes part in the
// collective, which the other ranks are in already; only its own result
// is an error.
Status AwaitInputs(Executor& executor, const std::vector<TensorTableEntry>& entries) {
  std::vector<DeviceEvent*> ready;
  for (const auto& e : entries) {
    // Host tensors (every CPU collective) have none: nothing to build.
    if (e.ready_event) ready.push_back(e.ready_event.get());
  }
  return ready.empty() ? Status::OK() : executor.AwaitInputs(ready);
}
Status AwaitInput(Executor& executor, const TensorTableEntry& e) {
  return e.ready_event ? executor.AwaitInput(*e.ready_event) : Status::OK();
}

// The first failure of this rank's own, or OK.
Status FirstFailure(const Status& a, const Status& b) { return a.ok() ? b : a; }

// InProgress is not a failure: the step has been queued on the device.
bool Failed(const Status& s) { return !s.ok() && !s.in_progress(); }

// The staging steps of a collective with no reduction (allgather, alltoall):
// the plane reads `in` and writes `out`, which are the tensors themselves or,
// when the plane works in other memory (host staging), the executor's
// staging buffers. StageIn copies the input across before the plane runs,
// StageOut the result back after it.
struct Staged {
  const void* in = nullptr;
  void* out = nullptr;
  bool queued = false;

  Status StageIn(Executor& ex, const void* input, int64_t in_bytes, void* output,
                 int64_t out_bytes) {
    void* in_buf = ex.PlaneBuffer(const_cast<void*>(input), 0, in_bytes);
    out = ex.PlaneBuffer(output, 1, out_bytes);
    in = in_buf;
    if (in_buf == input) return Status::OK();
    Status s = ex.Copy(in_buf, input, in_bytes);
    if (Failed(s)) return s;
    return ex.Synchronize();
  }
  Status StageOut(Executor& ex, void* output, int64_t out_bytes) {
    if (out == output) return Status::OK();
    Status s = ex.Copy(output, out, out_bytes);
    queued |= s.in_progress();
    return s;
  }
};

}  // namespace

int64_t TotalBytes(const Response& r) {
  int64_t n = 0;
  for (int64_t c : r.tensor_sizes) n += c;
  return n * DataTypeSize(r.dtype);
}

namespace {

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
  Status inputs;
  if (run.status.ok()) {
    inputs = AwaitInputs(*executor, mine);
    run = RunAllreduce(*executor, *plane, slots, r.dtype, r.reduce_op, r.prescale_factor,
                       r.postscale_factor, ps.size(), PhasesOf(r));
  }
  CompleteWhenDone(ps, std::move(mine), std::move(run), inputs);
}

// Allocates the entry's output; if that fails the rank still takes part in
// the collective (through scratch memory where the tensor would have lived)
// so the other ranks are not left waiting.
void* AllocateOrScratch(Executor& executor, TensorTableEntry& e, const TensorShape& shape,
                        std::shared_ptr<void>* scratch, Status* s) {
  void* out = nullptr;
  *s = e.allocate_output ? e.allocate_output(shape, &out)
                         : Status::Unknown("tfring: no output allocator for '" + e.name + "'");
  if (s->ok()) return out;
  const int64_t bytes = std::max<int64_t>(1, NumElements(shape) * DataTypeSize(e.dtype));
  *scratch = executor.Scratch(bytes);
  return scratch->get();
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
  if (!s.ok()) return Complete(e, s);
  const Status input = AwaitInput(*executor, e);
  std::shared_ptr<void> scratch;
  Status alloc;
  void* out = AllocateOrScratch(*executor, e, out_shape, &scratch, &alloc);
  Staged io;
  s = io.StageIn(*executor, e.input, e.input_bytes(), out, total);
  const auto start = Clock::now();
  // The plane runs even when staging failed: it is collective, and the other
  // ranks are in it already. This rank's result is then discarded.
  Status p = plane->Allgather(io.in, io.out, recv_bytes);
  io.queued |= p.in_progress();
  Phase(r.tensor_names, plane->last_used(), start, CollectiveName(CollectiveType::ALLGATHER));
  if (!Failed(s)) s = p;
  if (!Failed(s)) s = io.StageOut(*executor, out, total);
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(e));
  CompleteWhenDone(ps, std::move(entries), Settle(*executor, s, io.queued),
                   FirstFailure(input, alloc), scratch);
}

void PerformBroadcast(ProcessSet& ps, const Response& r) {
  TensorTableEntry e;
  if (!ps.queue.Take(r.tensor_names[0], &e)) return;
  const int64_t bytes = e.input_bytes();
  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  Status s = Route(ps, CollectiveType::BROADCAST, e.device, bytes, &plane, &executor);
  if (!s.ok()) return Complete(e, s);
  const Status input = AwaitInput(*executor, e);
  const bool root = ps.rank == r.root_rank;
  // Where the plane broadcasts: the output itself, or a staging buffer.
  void* buf = executor->PlaneBuffer(e.output, 1, bytes);
  const bool staged = buf != e.output;
  const bool fused = !staged && plane->broadcasts_out_of_place();
  bool queued = false;
  if (!fused && root && buf != e.input) {
    s = executor->Copy(buf, e.input, bytes);
    queued |= s.in_progress();
    if (staged && !Failed(s)) s = executor->Synchronize();
  }
  const auto start = Clock::now();
  Status p = fused ? plane->BroadcastOutOfPlace(e.input, e.output, bytes, r.root_rank)
                   : plane->Broadcast(buf, bytes, r.root_rank);
  queued |= p.in_progress();
  Phase(r.tensor_names, plane->last_used(), start, CollectiveName(CollectiveType::BROADCAST));
  if (!Failed(s)) s = p;
  if (staged && !Failed(s)) {
    s = executor->Copy(e.output, buf, bytes);
    queued |= s.in_progress();
  }
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(e));
  CompleteWhenDone(ps, std::move(entries), Settle(*executor, s, queued), input);
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
  if (!s.ok()) return Complete(e, s);
  const Status input = AwaitInput(*executor, e);
  int64_t recv_total = 0;
  for (int64_t b : recv) recv_total += b;
  std::shared_ptr<void> scratch;
  Status alloc;
  void* out = AllocateOrScratch(*executor, e, out_shape, &scratch, &alloc);
  Staged io;
  s = io.StageIn(*executor, e.input, e.input_bytes(), out, recv_total);
  const auto start = Clock::now();
  Status p = plane->Alltoall(io.in, send, io.out, recv);
  io.queued |= p.in_progress();
  Phase(r.tensor_names, plane->last_used(), start, CollectiveName(CollectiveType::ALLTOALL));
  if (!Failed(s)) s = p;
  if (!Failed(s)) s = io.StageOut(*executor, out, recv_total);
  // The splits are known now; the output's bytes only once the device is done.
  if (!Failed(s) && alloc.ok() && e.set_received_splits) {
    e.set_received_splits(received_splits);
  }
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(e));
  CompleteWhenDone(ps, std::move(entries), Settle(*executor, s, io.queued),
                   FirstFailure(input, alloc), scratch);
}

void PerformReducescatter(ProcessSet& ps, const Response& r) {
  TensorTableEntry e;
  if (!ps.queue.Take(r.tensor_names[0], &e)) return;
  const int n = ps.size();
  const int64_t rows = e.shape[0], row_elems = RowElements(e.shape);
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = ScatterRows(rows, n, i) * row_elems;
  TensorShape out_shape = e.shape;
  out_shape[0] = ScatterRows(rows, n, ps.rank);

  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  Status s = Route(ps, CollectiveType::REDUCESCATTER, e.device, e.input_bytes(), &plane, &executor);
  if (!s.ok()) return Complete(e, s);
  const Status input = AwaitInput(*executor, e);
  std::shared_ptr<void> scratch;
  Status alloc;
  void* out = AllocateOrScratch(*executor, e, out_shape, &scratch, &alloc);
  RunResult run = RunReducescatter(*executor, *plane, e.input, out, counts, ps.rank, e.dtype,
                                   r.reduce_op, r.prescale_factor, r.postscale_factor, PhasesOf(r));
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(e));
  CompleteWhenDone(ps, std::move(entries), std::move(run), FirstFailure(input, alloc), scratch);
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
    Watchdog().Drain(removed.get(), kDrainSeconds, gone);
    removed->queue.FailAll(gone);
  }
  if (have) Complete(e, s);
}

}  // namespace

void PerformOperation(ProcessSet& ps, const Response& r) {
  if (r.type == ResponseType::ERROR) {
    // The answer to a round this rank abandoned is not for a later entry of
    // the same name (TensorQueue::Abandon).
    std::vector<std::string> names;
    for (const std::string& name : r.tensor_names) {
      if (!ps.queue.EndAbandoned(name)) names.push_back(name);
    }
    return CompleteQueued(ps, names, Status::PreconditionError(r.error_message, r.error_cause));
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

}  // namespace tfring
