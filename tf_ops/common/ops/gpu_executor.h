// Executors for tensors on a GPU (executor.h explains the role of an
// executor). Two kinds, chosen per collective by where its plane works:
//
//  * GpuExecutor: the plane works in GPU memory (NCCL). Pack, scale and
//    unpack are cudaMemcpyAsync and kernels queued on the executor's own
//    stream, the plane queues its collective behind them, and Fence() is one
//    event for the whole collective. A tensor never leaves its GPU.
//  * HostStagedExecutor: the plane works in host memory (shared memory, the
//    ring, MPI), because NCCL cannot be used (two ranks on one GPU, or
//    TFRING_GPU_OPERATIONS=host). Tensors are copied into page-locked host
//    buffers, reduced there by the CPU code, and copied back asynchronously.
//
// Both reach CUDA through NcclApi (nccl_api.h), so they compile and are
// unit-tested against a fake on host memory.
#ifndef TFRING_COMMON_OPS_GPU_EXECUTOR_H
#define TFRING_COMMON_OPS_GPU_EXECUTOR_H

#include <atomic>
#include <memory>

#include "../executor.h"
#include "nccl_api.h"
#include "nccl_communicators.h"

namespace tfring {

// Device memory that grows on demand and is freed with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer(NcclApi* api, bool pinned_host) : api_(api), host_(pinned_host) {}
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // At least `bytes` long (contents not kept), or null with *error set.
  void* Get(int64_t bytes, int* error);
  int64_t capacity() const { return capacity_; }

 private:
  NcclApi* api_;
  bool host_;
  void* data_ = nullptr;
  int64_t capacity_ = 0;
};

// What the GPU executors of one process share: the API, the communicators
// (whose async errors and abort flag a fence watches) and the event pool.
struct GpuShared {
  NcclApi* api = nullptr;
  NcclCommunicators* comms = nullptr;
  std::shared_ptr<GpuEventPool> events;
  // Copies made between a GPU and host memory by host staging.
  std::atomic<int64_t> staged_copies{0};
};

// The ready event of a GPU input: recorded on the producer's stream (TF's
// compute stream, CuPy's or torch's current stream) when the input is handed
// over. An executor's stream waits for it on the device (QueueWait).
class GpuReadyEvent : public DeviceEvent {
 public:
  // Records a new event on `stream` of `device`.
  static Status Record(GpuShared* shared, int32_t device, GpuStream stream,
                       std::shared_ptr<DeviceEvent>* out);
  ~GpuReadyEvent() override;
  Status Query() override;
  bool waits_on_device() const override { return true; }
  Status QueueWait(void* stream) override;
  // The stream it was recorded on, unless that is a default stream (0, 1,
  // 2: legacy or per-thread, a different stream per device or thread).
  EventOrder order() const override { return order_; }

 private:
  GpuReadyEvent(std::shared_ptr<GpuEventPool> pool, GpuEvent event, EventOrder order)
      : pool_(std::move(pool)), event_(event), order_(order) {}
  std::shared_ptr<GpuEventPool> pool_;
  GpuEvent event_;
  EventOrder order_;
};

class GpuExecutor : public Executor {
 public:
  // Makes the executor's stream on `device`.
  static Status Create(GpuShared* shared, int32_t device, std::unique_ptr<Executor>* out);
  ~GpuExecutor() override;

  int32_t device() const override { return device_; }
  ExecutionContext context() const override { return {device_, stream_}; }
  void* FusionBuffer(int64_t bytes) override;
  Status Copy(void* dst, const void* src, int64_t bytes) override;
  // One copy kernel for all of them (cudaMemcpyAsync each cost more host
  // time than the GPU needed to copy a few MB).
  Status CopyMany(const std::vector<CopySpan>& spans) override;
  Status Zero(void* dst, int64_t bytes) override;
  Status Scale(void* buf, int64_t count, DataType dtype, double factor) override;
  Status FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op, double postscale,
                         int ranks) override;
  std::shared_ptr<void> Scratch(int64_t bytes) override;
  std::unique_ptr<DeviceEvent> Fence() override;
  // Queued on this executor's stream when the event can be (no host wait).
  Status AwaitInput(DeviceEvent& ready) override;

 protected:
  GpuExecutor(GpuShared* shared, int32_t device, GpuStream stream);
  Status Cuda(int error, const std::string& call) const;
  // Makes `device_` current on the calling thread.
  Status Activate() const;

  GpuShared* shared_;
  NcclApi* api_;
  int32_t device_;
  GpuStream stream_;
  bool watch_comms_ = true;  // a fence also polls the device's communicators

 private:
  DeviceBuffer fusion_;
};

class HostStagedExecutor : public GpuExecutor {
 public:
  static Status Create(GpuShared* shared, int32_t device, std::unique_ptr<Executor>* out);

  // The plane's memory is the host: the fusion buffer and staging buffers
  // are page-locked host memory; scaling runs on the CPU (reduction.h).
  void* FusionBuffer(int64_t bytes) override;
  Status Copy(void* dst, const void* src, int64_t bytes) override;
  // One counted host-device copy each, by DMA.
  Status CopyMany(const std::vector<CopySpan>& spans) override {
    return Executor::CopyMany(spans);
  }
  Status Zero(void* dst, int64_t bytes) override;
  Status Scale(void* buf, int64_t count, DataType dtype, double factor) override;
  Status FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op, double postscale,
                         int ranks) override;
  Status Synchronize() override;
  void* PlaneBuffer(void* tensor, int slot, int64_t bytes) override;
  // Every tensor is copied across, so even one tensor is reduced in the
  // (host) fusion buffer, never in its own output.
  Status PackAllreduce(const std::vector<ReduceSlot>& slots, DataType dtype, double prescale,
                       PackedReduction* out) override;
  Status PackReducescatter(const void* input, int64_t count, void* output, DataType dtype,
                           double prescale, const void** send, void** recv) override;

 private:
  HostStagedExecutor(GpuShared* shared, int32_t device, GpuStream stream);
  DeviceBuffer host_fusion_, in_, out_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_GPU_EXECUTOR_H
