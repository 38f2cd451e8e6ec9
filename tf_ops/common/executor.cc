#include "executor.h"

#include <cstring>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include "reduction.h"

namespace tfring {

namespace {

// InProgress is not a failure: the step has been queued on the device.
bool Failed(const Status& s) { return !s.ok() && !s.in_progress(); }

std::mutex& FactoryMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

GpuExecutorFactory& InstalledFactory() {
  static GpuExecutorFactory* factory = new GpuExecutorFactory();
  return *factory;
}

}  // namespace

// --- The reduction steps on the primitives -------------------------------

Status Executor::PackAllreduce(const std::vector<ReduceSlot>& slots, DataType dtype,
                               double prescale, PackedReduction* out) {
  const int64_t esize = DataTypeSize(dtype);
  if (slots.size() == 1 && slots[0].input && slots[0].output) {
    // One tensor: the plane reduces its input straight into its output, with
    // no fusion copy and no staging copy of the input. Only a prescale, which
    // must not touch the caller's input, needs the input in the output first.
    const ReduceSlot& slot = slots[0];
    out->buffer = slot.output;
    out->count = slot.count;
    out->fused = false;
    if (prescale == 1.0) {
      out->input = slot.input;
      return Status::OK();
    }
    Status s;
    if (slot.output != slot.input) s = Copy(slot.output, slot.input, slot.count * esize);
    if (Failed(s)) return s;
    return Scale(out->buffer, out->count, dtype, prescale);
  }
  return PackFused(slots, dtype, prescale, out);
}

Status Executor::PackFused(const std::vector<ReduceSlot>& slots, DataType dtype, double prescale,
                           PackedReduction* out) {
  const int64_t esize = DataTypeSize(dtype);
  std::vector<int64_t> bytes(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) bytes[i] = slots[i].count * esize;
  out->layout = PlanFusion(bytes);
  out->count = out->layout.total_bytes / esize;
  out->fused = true;
  out->input = nullptr;
  char* buf = static_cast<char*>(FusionBuffer(out->layout.total_bytes));
  out->buffer = buf;
  if (!buf && out->layout.total_bytes > 0) {
    return Status::Unknown("tfring: could not allocate a fusion buffer of " +
                           std::to_string(out->layout.total_bytes) + " bytes for " +
                           DeviceName(device()));
  }
  std::vector<CopySpan> copies;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].input) {
      copies.push_back({buf + out->layout.offsets[i], slots[i].input, bytes[i]});
      continue;
    }
    // A rank that has joined contributes zeros for tensors it never submitted.
    Status s = Zero(buf + out->layout.offsets[i], bytes[i]);
    if (Failed(s)) return s;
  }
  Status s = CopyMany(copies);
  if (Failed(s)) return s;
  return Scale(buf, out->count, dtype, prescale);
}

Status Executor::AwaitInput(DeviceEvent& ready) {
  // The queue announces a request whose event cannot be waited for on a
  // device only once the event has happened, so this returns at once there.
  Status s;
  while ((s = ready.Query()).in_progress()) std::this_thread::yield();
  return s;
}

Status Executor::AwaitInputs(const std::vector<DeviceEvent*>& ready) {
  std::map<const void*, DeviceEvent*> latest;  // per queue
  std::set<DeviceEvent*> seen;  // a group's tensors may share one event
  std::vector<DeviceEvent*> waits;
  for (DeviceEvent* e : ready) {
    if (e == nullptr || !seen.insert(e).second) continue;
    const EventOrder order = e->order();
    if (order.queue == nullptr) {
      waits.push_back(e);
      continue;
    }
    DeviceEvent*& last = latest[order.queue];
    if (last == nullptr || last->order().seq < order.seq) last = e;
  }
  for (const auto& kv : latest) waits.push_back(kv.second);
  Status first;
  for (DeviceEvent* e : waits) {
    Status s = AwaitInput(*e);
    if (first.ok()) first = s;
  }
  return first;
}

Status Executor::CopyMany(const std::vector<CopySpan>& spans) {
  Status s;
  for (const CopySpan& c : spans) {
    s = Copy(c.dst, c.src, c.bytes);
    if (Failed(s)) return s;
  }
  return s;
}

Status Executor::UnpackAllreduce(const PackedReduction& packed, const std::vector<ReduceSlot>& slots,
                                 DataType dtype, ReduceOp op, double postscale, int ranks) {
  Status s = FinishReduction(packed.buffer, packed.count, dtype, op, postscale, ranks);
  if (Failed(s) || !packed.fused) return s;
  const char* buf = static_cast<const char*>(packed.buffer);
  const int64_t esize = DataTypeSize(dtype);
  std::vector<CopySpan> copies;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].output)
      copies.push_back({slots[i].output, buf + packed.layout.offsets[i], slots[i].count * esize});
  }
  Status out = CopyMany(copies);
  return Failed(out) || out.in_progress() ? out : s;
}

Status Executor::PackReducescatter(const void* input, int64_t count, void* output, DataType dtype,
                                   double prescale, const void** send, void** recv) {
  *send = input;
  *recv = output;
  if (prescale == 1.0) return Status::OK();
  // Prescaling must not touch the caller's input: scale a copy.
  const int64_t bytes = count * DataTypeSize(dtype);
  void* buf = FusionBuffer(bytes);
  if (!buf && bytes > 0) {
    return Status::Unknown("tfring: could not allocate a fusion buffer of " +
                           std::to_string(bytes) + " bytes on " + DeviceName(device()));
  }
  *send = buf;
  Status s = Copy(buf, input, bytes);
  if (Failed(s)) return s;
  return Scale(buf, count, dtype, prescale);
}

Status Executor::UnpackReducescatter(void* recv, void* output, int64_t out_count, DataType dtype,
                                     ReduceOp op, double postscale, int ranks) {
  Status s = FinishReduction(recv, out_count, dtype, op, postscale, ranks);
  if (Failed(s) || recv == output) return s;
  return Copy(output, recv, out_count * DataTypeSize(dtype));
}

// --- CPU ------------------------------------------------------------------

Status CpuExecutor::Copy(void* dst, const void* src, int64_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  return Status::OK();
}

Status CpuExecutor::Zero(void* dst, int64_t bytes) {
  if (bytes > 0) std::memset(dst, 0, static_cast<size_t>(bytes));
  return Status::OK();
}

Status CpuExecutor::Scale(void* buf, int64_t count, DataType dtype, double factor) {
  return ScaleBuffer(buf, count, dtype, factor);
}

Status CpuExecutor::FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op,
                                    double postscale, int ranks) {
  return tfring::FinishReduction(buf, count, dtype, op, postscale, ranks);
}

// --- Executors per device --------------------------------------------------

void SetGpuExecutorFactory(GpuExecutorFactory factory) {
  std::lock_guard<std::mutex> lock(FactoryMutex());
  InstalledFactory() = std::move(factory);
}

Status ExecutorTable::Get(int32_t device, bool plane_on_gpu, Executor** out) {
  if (!IsGpuDevice(device)) {
    if (plane_on_gpu) {
      return Status::Unknown("tfring: a CPU tensor was routed to a GPU data plane");
    }
    *out = &cpu_;
    return Status::OK();
  }
  const bool host_staged = !plane_on_gpu;
  auto key = std::make_pair(device, host_staged);
  auto it = gpu_.find(key);
  if (it == gpu_.end()) {
    GpuExecutorFactory factory = gpu_factory_;
    if (!factory) {
      std::lock_guard<std::mutex> lock(FactoryMutex());
      factory = InstalledFactory();
    }
    if (!factory) {
      return Status::InvalidArgument(
          "tfring: this build has no GPU support, so it cannot run collectives on tensors on " +
          DeviceName(device) + "; place them on the CPU, or build tfring with CUDA");
    }
    std::unique_ptr<Executor> made;
    TFRING_RETURN_IF_ERROR(factory(device, host_staged, &made));
    if (!made) return Status::Unknown("tfring: no executor for " + DeviceName(device));
    it = gpu_.emplace(key, std::move(made)).first;
  }
  *out = it->second.get();
  return Status::OK();
}

// --- Running a reduction ---------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

RunResult Settle(Executor& executor, const Status& s, bool queued) {
  RunResult result;
  if (Failed(s)) {
    // Work already queued must still finish before the outputs are handed
    // back; the error is reported once it has.
    result.pending = executor.Fence();
    if (result.pending) {
      result.status = Status::InProgress();
      // Reports the step's error once the device is done.
      struct FailAfter : DeviceEvent {
        std::unique_ptr<DeviceEvent> inner;
        Status failure;
        Status Query() override {
          Status q = inner->Query();
          return q.ok() ? failure : q;
        }
      };
      auto wrapped = std::make_unique<FailAfter>();
      wrapped->inner = std::move(result.pending);
      wrapped->failure = s;
      result.pending = std::move(wrapped);
    } else {
      result.status = s;
    }
    return result;
  }
  result.pending = executor.Fence();
  if (result.pending) {
    result.status = Status::InProgress();
  } else if (queued) {
    // A plane returned InProgress but the executor has nothing to wait on:
    // the pair was not built to work together.
    result.status = Status::Unknown(
        "tfring: a data plane left a collective running, but the executor on " +
        DeviceName(executor.device()) + " has no event to wait for it");
  } else {
    result.status = Status::OK();
  }
  return result;
}

namespace {

// Fused tensors this large on average are reduced in one grouped call of
// the plane rather than packed into the fusion buffer. On one H100 (np=1) a
// grouped NCCL allreduce cost ~7 us of host time per tensor, while packing
// (one copy kernel in, one out) cost two copies of GPU time per tensor:
// below ~4 MB the copies are cheaper.
constexpr int64_t kGroupMinAverageBytes = int64_t{4} << 20;

// Whether `slots` can be reduced by the plane tensor by tensor, in one
// grouped call, rather than packed into the fusion buffer: several large
// tensors, all of them this rank's (a joined rank's zeros need a buffer), and
// no prescale (which must not touch the caller's inputs).
bool GroupsWithoutPacking(const DataPlane& plane, const std::vector<ReduceSlot>& slots,
                          DataType dtype, ReduceOp op, double prescale) {
  if (slots.size() < 2 || op == ReduceOp::ADASUM || prescale != 1.0 || !plane.reduces_groups())
    return false;
  int64_t count = 0;
  for (const ReduceSlot& slot : slots) {
    if (!slot.input || !slot.output) return false;
    count += slot.count;
  }
  return count * DataTypeSize(dtype) >=
         kGroupMinAverageBytes * static_cast<int64_t>(slots.size());
}

}  // namespace

RunResult RunAllreduce(Executor& executor, DataPlane& plane, const std::vector<ReduceSlot>& slots,
                       DataType dtype, ReduceOp op, double prescale, double postscale, int ranks,
                       const PhaseFn& phase) {
  const ReduceOp plane_op = op == ReduceOp::AVERAGE ? ReduceOp::SUM : op;
  bool queued = false;
  if (GroupsWithoutPacking(plane, slots, dtype, op, prescale)) {
    auto start = Clock::now();
    Status s = plane.AllreduceGroup(slots, dtype, plane_op);
    queued |= s.in_progress();
    if (phase) {
      phase(std::string(plane.last_used()) + "_" + CollectiveName(CollectiveType::ALLREDUCE),
            start);
    }
    // Each output is finished where it lies: for Sum, and for Average at
    // np=1, that queues nothing.
    for (const ReduceSlot& slot : slots) {
      if (Failed(s)) break;
      s = executor.FinishReduction(slot.output, slot.count, dtype, op, postscale, ranks);
      queued |= s.in_progress();
    }
    return Settle(executor, s, queued);
  }
  PackedReduction packed;
  auto start = Clock::now();
  Status s = executor.PackAllreduce(slots, dtype, prescale, &packed);
  queued |= s.in_progress();
  if (packed.fused && phase) phase("MEMCPY_IN_FUSION_BUFFER", start);
  if (Failed(s)) return Settle(executor, s, queued);
  start = Clock::now();
  const void* input = packed.input ? packed.input : packed.buffer;
  if (op == ReduceOp::ADASUM) {
    // Adasum needs the tensor boundaries: its dot products are per tensor;
    // and it works in place.
    if (input != packed.buffer) {
      s = executor.Copy(packed.buffer, input, packed.count * DataTypeSize(dtype));
      queued |= s.in_progress();
      if (Failed(s)) return Settle(executor, s, queued);
    }
    std::vector<int64_t> counts(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) counts[i] = slots[i].count;
    s = plane.Adasum(packed.buffer, counts, dtype);
  } else {
    s = plane.Allreduce(input, packed.buffer, packed.count, dtype, plane_op);
  }
  queued |= s.in_progress();
  if (phase) {
    phase(std::string(plane.last_used()) + "_" + CollectiveName(CollectiveType::ALLREDUCE), start);
  }
  if (Failed(s)) return Settle(executor, s, queued);
  start = Clock::now();
  s = executor.UnpackAllreduce(packed, slots, dtype, op, postscale, ranks);
  queued |= s.in_progress();
  if (packed.fused && phase) phase("MEMCPY_OUT_FUSION_BUFFER", start);
  return Settle(executor, s, queued);
}

RunResult RunReducescatter(Executor& executor, DataPlane& plane, const void* input, void* output,
                           const std::vector<int64_t>& recv_counts, int rank, DataType dtype,
                           ReduceOp op, double prescale, double postscale, const PhaseFn& phase) {
  const ReduceOp plane_op = op == ReduceOp::AVERAGE ? ReduceOp::SUM : op;
  int64_t count = 0;
  for (int64_t c : recv_counts) count += c;
  bool queued = false;
  const void* send = nullptr;
  void* recv = nullptr;
  Status s = executor.PackReducescatter(input, count, output, dtype, prescale, &send, &recv);
  queued |= s.in_progress();
  // The plane runs even when packing failed: it is collective, and the other
  // ranks are in it already. This rank's result is then discarded.
  if (!send) send = input;
  if (!recv) recv = output;
  const auto start = Clock::now();
  Status rs = plane.Reducescatter(send, recv, recv_counts, dtype, plane_op);
  queued |= rs.in_progress();
  if (phase) {
    phase(std::string(plane.last_used()) + "_" + CollectiveName(CollectiveType::REDUCESCATTER),
          start);
  }
  if (Failed(s)) return Settle(executor, s, queued);
  if (Failed(rs)) return Settle(executor, rs, queued);
  s = executor.UnpackReducescatter(recv, output, recv_counts[rank], dtype, op, postscale,
                                   static_cast<int>(recv_counts.size()));
  queued |= s.in_progress();
  return Settle(executor, s, queued);
}

}  // namespace tfring
