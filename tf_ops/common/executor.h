// Runs one negotiated reduction on a data plane, with the steps around it
// that depend on where the tensors live. A data plane only reduces a buffer
// across ranks. Getting the tensors into that buffer (pack), applying the
// prescale, postscale and average factors (scale), and copying the results
// back out (unpack) are memcpy and loops over host memory on the CPU, but
// cudaMemcpyAsync and kernels on a stream on a GPU, and device-to-host
// copies when GPU tensors are reduced by a CPU plane (host staging). So each
// device has an Executor, and the run functions below are written once
// against it. Every process set keeps one executor per device, and with it
// one fusion buffer per device.
//
// Asynchronous devices: an executor's primitives may only queue their work
// (in order, on one stream), and a data plane may return Status::InProgress
// from a collective it has queued on that same stream. Each step is then
// queued behind the previous one, and Fence() hands back one event for the
// whole collective; the device watchdog (device_watchdog.h) queries it instead
// of anyone waiting. A CPU executor does everything at once and its Fence() is null.
#ifndef TFRING_COMMON_EXECUTOR_H
#define TFRING_COMMON_EXECUTOR_H

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "device_event.h"
#include "fusion_buffer.h"
#include "ops/data_plane.h"
#include "status.h"

namespace tfring {

// One copy of several made together (packing or unpacking a fusion buffer).
struct CopySpan {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t bytes = 0;
};

// What PackAllreduce hands to the data plane.
struct PackedReduction {
  // What the plane reduces: from `input` into `buffer`. Null `input` means
  // `buffer` itself (in place).
  const void* input = nullptr;
  void* buffer = nullptr;
  int64_t count = 0;       // elements
  // True when the tensors were copied into the fusion buffer; false when the
  // only tensor is reduced straight from its input into its output (no copy).
  bool fused = false;
  FusionLayout layout;     // byte offset of each slot in `buffer` (when fused)
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Where this executor's tensors live (kCpuDevice or a GPU ordinal).
  virtual int32_t device() const = 0;

  // --- Primitives over the memory the plane works in. They may queue their
  // work instead of doing it; what they queue runs in call order.
  // The fusion buffer, at least `bytes` long; valid until the next call.
  virtual void* FusionBuffer(int64_t bytes) = 0;
  virtual Status Copy(void* dst, const void* src, int64_t bytes) = 0;
  // Every span's copy; a GPU does them in one kernel launch.
  virtual Status CopyMany(const std::vector<CopySpan>& spans);
  virtual Status Zero(void* dst, int64_t bytes) = 0;
  // buf[i] *= factor (nothing when factor is 1).
  virtual Status Scale(void* buf, int64_t count, DataType dtype, double factor) = 0;
  // Postscale and, for AVERAGE, division by `ranks` (see reduction.h).
  virtual Status FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op,
                                 double postscale, int ranks) = 0;
  // Waits until everything queued so far has run (a host plane is about to
  // read what was copied to host memory). Synchronous executors: nothing.
  virtual Status Synchronize() { return Status::OK(); }
  // What a plane needs to queue its work behind this executor's.
  virtual ExecutionContext context() const {
    ExecutionContext c;
    c.device = device();
    return c;
  }
  // Where a plane reads or writes `bytes` of `tensor` (a collective with no
  // reduction step: allgather, broadcast, alltoall): the tensor itself when
  // the plane works in the tensor's memory, else a staging buffer in the
  // plane's memory (`slot` 0 for the input, 1 for the output; each valid
  // until its next use). The caller copies in (then Synchronize) and out.
  virtual void* PlaneBuffer(void* tensor, int slot, int64_t bytes) {
    (void)slot;
    (void)bytes;
    return tensor;
  }
  // `bytes` of memory on this executor's device, freed when the last
  // reference goes (for an output that could not be allocated: the rank
  // still takes part in the collective).
  virtual std::shared_ptr<void> Scratch(int64_t bytes) {
    return std::shared_ptr<void>(new char[static_cast<size_t>(bytes)],
                                 [](void* p) { delete[] static_cast<char*>(p); });
  }
  // An event that happens once everything queued so far has run (including
  // plane work queued on the same stream), or null when nothing is
  // outstanding: a synchronous executor always returns null.
  virtual std::unique_ptr<DeviceEvent> Fence() { return nullptr; }
  // Holds back what this executor queues next until `ready` (an input's
  // ready event) has happened: on the device where the event allows it,
  // else here, by polling it (a host executor's work runs at once).
  virtual Status AwaitInput(DeviceEvent& ready);
  // AwaitInput for each of `ready` (nulls skipped), except those that a later
  // event of the same queue covers (EventOrder). Returns the first failure.
  Status AwaitInputs(const std::vector<DeviceEvent*>& ready);

  // --- The steps of a reduction, written once on the primitives above. An
  // executor overrides them when it can do better (one batched kernel for
  // many small tensors) or must do otherwise (host staging copies every
  // tensor across, so it never reduces in a tensor's own output).
  //
  // Gathers `slots` into one buffer of `dtype` and applies `prescale`.
  virtual Status PackAllreduce(const std::vector<ReduceSlot>& slots, DataType dtype,
                               double prescale, PackedReduction* out);
  // Applies postscale/average to the reduced buffer and copies each slot's
  // part to its output.
  virtual Status UnpackAllreduce(const PackedReduction& packed, const std::vector<ReduceSlot>& slots,
                                 DataType dtype, ReduceOp op, double postscale, int ranks);
  // Reducescatter of `input` (`count` elements) into `output`: *send is what
  // the plane reads (prescaled), *recv where it writes this rank's share.
  virtual Status PackReducescatter(const void* input, int64_t count, void* output, DataType dtype,
                                   double prescale, const void** send, void** recv);
  // Applies postscale/average to this rank's `out_count` elements and
  // leaves them in `output`.
  virtual Status UnpackReducescatter(void* recv, void* output, int64_t out_count, DataType dtype,
                                     ReduceOp op, double postscale, int ranks);

 protected:
  // PackAllreduce's fused path: every slot copied into the fusion buffer
  // (zeros for an empty slot), then prescaled.
  Status PackFused(const std::vector<ReduceSlot>& slots, DataType dtype, double prescale,
                   PackedReduction* out);
};

// Host memory: memcpy and reduction.cc's vectorised loops, all synchronous.
class CpuExecutor : public Executor {
 public:
  int32_t device() const override { return kCpuDevice; }
  void* FusionBuffer(int64_t bytes) override { return buffer_.Get(bytes); }
  Status Copy(void* dst, const void* src, int64_t bytes) override;
  Status Zero(void* dst, int64_t bytes) override;
  Status Scale(void* buf, int64_t count, DataType dtype, double factor) override;
  Status FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op, double postscale,
                         int ranks) override;
  int64_t fusion_capacity() const { return buffer_.capacity(); }

 private:
  tfring::FusionBuffer buffer_;
};

// Makes the executor for tensors on GPU `device`: reducing on a GPU plane,
// or host-staged for a plane that works in host memory.
using GpuExecutorFactory =
    std::function<Status(int32_t device, bool host_staged, std::unique_ptr<Executor>* out)>;
// A GPU build installs its factory once, when the library loads. Without
// one, GPU tensors fail with an error saying that the build has no GPU support.
void SetGpuExecutorFactory(GpuExecutorFactory factory);

// One process set's executors, made on first use: one per device, and per
// GPU one for its GPU plane and one for host staging.
class ExecutorTable {
 public:
  // `gpu_factory` null: the factory installed with SetGpuExecutorFactory.
  explicit ExecutorTable(GpuExecutorFactory gpu_factory = nullptr)
      : gpu_factory_(std::move(gpu_factory)) {}
  // The executor for tensors on `device` reduced by a plane that works in GPU
  // memory (`plane_on_gpu`) or in host memory.
  Status Get(int32_t device, bool plane_on_gpu, Executor** out);

 private:
  GpuExecutorFactory gpu_factory_;
  CpuExecutor cpu_;
  std::map<std::pair<int32_t, bool>, std::unique_ptr<Executor>> gpu_;
};

// Records on the timeline that `phase` of the running collective began at
// `start` and has just ended (for an asynchronous device: has been queued).
// Empty while the timeline is off: the phase's name is then never built (a
// name longer than std::string's inline buffer was an allocation per
// collective).
using PhaseFn =
    std::function<void(const std::string& phase, std::chrono::steady_clock::time_point start)>;

// How one reduction went: OK or its error once finished, or InProgress with
// `pending` the event to poll until the device has finished it.
struct RunResult {
  Status status;
  std::unique_ptr<DeviceEvent> pending;
};

// The verdict of a collective whose steps so far returned `status`
// (`queued`: some returned InProgress): the error, OK, or InProgress with the
// executor's event for what is still running on the device.
RunResult Settle(Executor& executor, const Status& status, bool queued);

// Allreduce of `slots` (one tensor, or several fused): pack, reduce on
// `plane`, unpack. `op` may be AVERAGE; the plane is asked for SUM.
RunResult RunAllreduce(Executor& executor, DataPlane& plane, const std::vector<ReduceSlot>& slots,
                       DataType dtype, ReduceOp op, double prescale, double postscale, int ranks,
                       const PhaseFn& phase);

// Reducescatter of `input`: rank r keeps recv_counts[r] elements of the
// reduced tensor; this rank's (`rank`'s) share is written to `output`.
RunResult RunReducescatter(Executor& executor, DataPlane& plane, const void* input, void* output,
                           const std::vector<int64_t>& recv_counts, int rank, DataType dtype,
                           ReduceOp op, double prescale, double postscale, const PhaseFn& phase);

}  // namespace tfring

#endif  // TFRING_COMMON_EXECUTOR_H
