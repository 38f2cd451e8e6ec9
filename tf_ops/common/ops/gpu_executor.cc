#if defined(TFRING_WITH_NCCL) || defined(TFRING_NCCL_PLANE_LOGIC)

#include "gpu_executor.h"

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include "../reduction.h"

namespace tfring {

// --- DeviceBuffer -------------------------------------------------------------

DeviceBuffer::~DeviceBuffer() {
  if (data_ == nullptr) return;
  if (host_) {
    api_->FreeHost(data_);
  } else {
    api_->Free(data_);
  }
}

void* DeviceBuffer::Get(int64_t bytes, int* error) {
  *error = 0;
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  // Grow by half again, so that a slowly growing fusion buffer is not
  // reallocated every cycle.
  int64_t cap = std::max<int64_t>(std::max<int64_t>(bytes, 256), capacity_ + capacity_ / 2);
  cap = (cap + 255) / 256 * 256;
  if (data_ != nullptr) {
    // Memory a queued copy may still use: the callers' streams run in order
    // and every user of a buffer is on the owner's stream, but cudaFree
    // itself synchronises the device, so this is safe for the device case;
    // page-locked host memory is only replaced after a Synchronize().
    *error = host_ ? api_->FreeHost(data_) : api_->Free(data_);
    data_ = nullptr;
    capacity_ = 0;
    if (*error != 0) return nullptr;
  }
  *error = host_ ? api_->MallocHost(&data_, cap) : api_->Malloc(&data_, cap);
  if (*error != 0) {
    data_ = nullptr;
    return nullptr;
  }
  capacity_ = cap;
  return data_;
}

namespace {

// Makes `stream` wait on the device for `event` of `pool`; `what` names the
// event in the error.
Status QueueStreamWait(GpuEventPool& pool, GpuEvent event, void* stream, const char* what) {
  const int err = pool.api()->StreamWaitEvent(stream, event);
  return err == 0 ? Status::OK()
                  : CudaErrorToStatus(err, std::string("cudaStreamWaitEvent on ") + what,
                                      pool.api()->CudaErrorString(err));
}

// The fence of a GPU executor: one event recorded after everything it queued.
// The watchdog queries it; a binding may hold it too, to make its caller's
// stream wait for it, so the event goes back to the pool only when both let
// go (the pool itself is shared for that reason).
class StreamFence : public DeviceEvent {
 public:
  StreamFence(GpuShared* shared, GpuEvent event, int32_t device, bool watch_comms)
      : shared_(shared), pool_(shared->events), event_(event), device_(device),
        watch_comms_(watch_comms) {}
  ~StreamFence() override { pool_->Release(event_); }

  bool waits_on_device() const override { return true; }
  // The caller's stream waits on the device. What a failure leaves in the
  // output (an aborted communicator's event happens too) is reported by the
  // watchdog's Query, which fails the collective and stops the job.
  Status QueueWait(void* stream) override {
    return QueueStreamWait(*pool_, event_, stream, "a collective's fence");
  }

  Status Query() override {
    NcclApi* api = shared_->api;
    int err = 0;
    const EventState state = api->EventQuery(event_, &err);
    if (state == EventState::kError) {
      return CudaErrorToStatus(err, "a collective on " + DeviceName(device_),
                               api->CudaErrorString(err));
    }
    // Work that ran to its end before an abort finished with good results;
    // work the abort cut short may have "finished" with garbage.
    NcclAbortFlag& abort = *shared_->comms->abort_flag();
    if (state == EventState::kDone && !(watch_comms_ && abort.requested())) return Status::OK();
    if (!watch_comms_) return Status::InProgress();
    Status s = shared_->comms->CheckDevice(device_);
    return s.ok() ? Status::InProgress() : s;
  }

 private:
  GpuShared* shared_;
  std::shared_ptr<GpuEventPool> pool_;
  GpuEvent event_;
  int32_t device_;
  bool watch_comms_;
};

}  // namespace

// --- GpuReadyEvent -------------------------------------------------------------

Status GpuReadyEvent::Record(GpuShared* shared, int32_t device, GpuStream stream,
                             std::shared_ptr<DeviceEvent>* out) {
  NcclApi* api = shared->api;
  int err = api->SetDevice(device);
  if (err != 0) {
    return CudaErrorToStatus(err, "cudaSetDevice(" + std::to_string(device) + ")",
                             api->CudaErrorString(err));
  }
  GpuEvent event = nullptr;
  err = shared->events->Acquire(&event);
  EventOrder order;
  if (err == 0) {
    // The sequence number must follow the order of the records themselves,
    // which threads of one framework may make on one stream at once.
    static std::mutex record_mu;
    static uint64_t records = 0;
    std::lock_guard<std::mutex> lock(record_mu);
    err = api->EventRecord(event, stream);
    order.seq = ++records;
  }
  if (err != 0) {
    if (event != nullptr) shared->events->Release(event);
    return CudaErrorToStatus(err, "recording a ready event", api->CudaErrorString(err));
  }
  if (reinterpret_cast<uintptr_t>(stream) > 2) order.queue = stream;
  out->reset(new GpuReadyEvent(shared->events, event, order));
  return Status::OK();
}

// The pool may hand the event out again at once: a stream wait queued
// before then waits for the record it saw, not for a later one.
GpuReadyEvent::~GpuReadyEvent() { pool_->Release(event_); }

Status GpuReadyEvent::Query() {
  int err = 0;
  switch (pool_->api()->EventQuery(event_, &err)) {
    case EventState::kDone: return Status::OK();
    case EventState::kPending: return Status::InProgress();
    case EventState::kError: break;
  }
  return CudaErrorToStatus(err, "the kernels producing a collective's input",
                           pool_->api()->CudaErrorString(err));
}

Status GpuReadyEvent::QueueWait(void* stream) {
  return QueueStreamWait(*pool_, event_, stream, "a collective's input");
}

// --- GpuExecutor ----------------------------------------------------------------

GpuExecutor::GpuExecutor(GpuShared* shared, int32_t device, GpuStream stream)
    : shared_(shared), api_(shared->api), device_(device), stream_(stream),
      fusion_(shared->api, /*pinned_host=*/false) {}

GpuExecutor::~GpuExecutor() {
  api_->SetDevice(device_);
  api_->StreamSynchronize(stream_);
  api_->StreamDestroy(stream_);
}

namespace {

// A new stream on `device` for an executor of its own.
Status MakeStream(NcclApi* api, int32_t device, GpuStream* stream) {
  int err = api->SetDevice(device);
  if (err != 0) {
    return CudaErrorToStatus(err, "cudaSetDevice(" + std::to_string(device) + ")",
                             api->CudaErrorString(err));
  }
  err = api->StreamCreate(stream);
  return err == 0 ? Status::OK()
                  : CudaErrorToStatus(err, "cudaStreamCreate", api->CudaErrorString(err));
}

}  // namespace

Status GpuExecutor::Create(GpuShared* shared, int32_t device, std::unique_ptr<Executor>* out) {
  GpuStream stream = nullptr;
  TFRING_RETURN_IF_ERROR(MakeStream(shared->api, device, &stream));
  out->reset(new GpuExecutor(shared, device, stream));
  return Status::OK();
}

Status GpuExecutor::Cuda(int error, const std::string& call) const {
  return error == 0 ? Status::OK() : CudaErrorToStatus(error, call, api_->CudaErrorString(error));
}

Status GpuExecutor::Activate() const { return Cuda(api_->SetDevice(device_), "cudaSetDevice"); }

void* GpuExecutor::FusionBuffer(int64_t bytes) {
  if (!Activate().ok()) return nullptr;
  int err = 0;
  return fusion_.Get(bytes, &err);
}

Status GpuExecutor::Copy(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0 || dst == src) return Status::OK();
  return Cuda(api_->MemcpyAsync(dst, src, bytes, stream_), "cudaMemcpyAsync");
}

Status GpuExecutor::CopyMany(const std::vector<CopySpan>& spans) {
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<int64_t> bytes;
  for (const CopySpan& c : spans) {
    if (c.bytes == 0 || c.dst == c.src) continue;
    dst.push_back(c.dst);
    src.push_back(c.src);
    bytes.push_back(c.bytes);
  }
  if (dst.empty()) return Status::OK();
  return Cuda(api_->CopyBatch(dst.data(), src.data(), bytes.data(), static_cast<int>(dst.size()),
                              stream_),
              "the copy kernel");
}

Status GpuExecutor::Zero(void* dst, int64_t bytes) {
  if (bytes == 0) return Status::OK();
  return Cuda(api_->MemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
}

Status GpuExecutor::Scale(void* buf, int64_t count, DataType dtype, double factor) {
  if (factor == 1.0 || count == 0) return Status::OK();
  if (dtype == DataType::BOOL) {
    return Status::InvalidArgument("tfring: bool tensors cannot be scaled (use op=Sum, Min or Max)");
  }
  return Cuda(api_->Scale(buf, buf, count, dtype, factor, stream_), "the scaling kernel");
}

Status GpuExecutor::FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op,
                                    double postscale, int ranks) {
  // The CPU's FinishReduction (reduction.cc), step for step, so that the
  // results agree bit for bit: one rounding of x * postscale / ranks with a
  // postscale, else a division by the ranks in the dtype's own arithmetic.
  if (op != ReduceOp::AVERAGE) return Scale(buf, count, dtype, postscale);
  if (IsFloatingPoint(dtype) && postscale != 1.0) {
    return Scale(buf, count, dtype, postscale / ranks);
  }
  if (dtype == DataType::BOOL) {
    return Status::InvalidArgument(
        "tfring: bool tensors cannot be averaged (use op=Sum, Min or Max)");
  }
  TFRING_RETURN_IF_ERROR(Scale(buf, count, dtype, postscale));
  if (ranks == 1 || count == 0) return Status::OK();  // x / 1 is x
  return Cuda(api_->Divide(buf, count, dtype, ranks, stream_), "the division kernel of Average");
}

std::shared_ptr<void> GpuExecutor::Scratch(int64_t bytes) {
  void* p = nullptr;
  if (!Activate().ok() || api_->Malloc(&p, bytes) != 0) return nullptr;
  NcclApi* api = api_;
  return std::shared_ptr<void>(p, [api](void* q) { api->Free(q); });
}

std::unique_ptr<DeviceEvent> GpuExecutor::Fence() {
  GpuEvent event = nullptr;
  int err = shared_->events->Acquire(&event);
  if (err == 0) err = api_->EventRecord(event, stream_);
  if (err != 0) {
    // No event: wait here instead (the collective is still correct).
    if (event != nullptr) shared_->events->Release(event);
    api_->StreamSynchronize(stream_);
    return nullptr;
  }
  return std::unique_ptr<DeviceEvent>(new StreamFence(shared_, event, device_, watch_comms_));
}

Status GpuExecutor::AwaitInput(DeviceEvent& ready) {
  if (!ready.waits_on_device()) return Executor::AwaitInput(ready);
  return ready.QueueWait(stream_);
}

// --- HostStagedExecutor ---------------------------------------------------------

HostStagedExecutor::HostStagedExecutor(GpuShared* shared, int32_t device, GpuStream stream)
    : GpuExecutor(shared, device, stream),
      host_fusion_(shared->api, /*pinned_host=*/true),
      in_(shared->api, true),
      out_(shared->api, true) {
  watch_comms_ = false;  // its planes are host planes: no communicator to watch
}

Status HostStagedExecutor::Create(GpuShared* shared, int32_t device,
                                  std::unique_ptr<Executor>* out) {
  GpuStream stream = nullptr;
  TFRING_RETURN_IF_ERROR(MakeStream(shared->api, device, &stream));
  out->reset(new HostStagedExecutor(shared, device, stream));
  return Status::OK();
}

void* HostStagedExecutor::FusionBuffer(int64_t bytes) {
  // Replacing page-locked memory that a queued copy still reads is unsafe.
  if (bytes > host_fusion_.capacity() && !Synchronize().ok()) return nullptr;
  int err = 0;
  return host_fusion_.Get(bytes, &err);
}

void* HostStagedExecutor::PlaneBuffer(void* tensor, int slot, int64_t bytes) {
  (void)tensor;
  DeviceBuffer& b = slot == 0 ? in_ : out_;
  if (bytes > b.capacity() && !Synchronize().ok()) return nullptr;
  int err = 0;
  return b.Get(std::max<int64_t>(bytes, 1), &err);
}

Status HostStagedExecutor::Copy(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0 || dst == src) return Status::OK();
  shared_->staged_copies.fetch_add(1, std::memory_order_relaxed);
  return Cuda(api_->MemcpyAsync(dst, src, bytes, stream_), "cudaMemcpyAsync(host staging)");
}

Status HostStagedExecutor::Zero(void* dst, int64_t bytes) {
  if (bytes > 0) std::memset(dst, 0, static_cast<size_t>(bytes));  // host memory
  return Status::OK();
}

Status HostStagedExecutor::Scale(void* buf, int64_t count, DataType dtype, double factor) {
  return ScaleBuffer(buf, count, dtype, factor);
}

Status HostStagedExecutor::FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op,
                                           double postscale, int ranks) {
  return tfring::FinishReduction(buf, count, dtype, op, postscale, ranks);
}

Status HostStagedExecutor::Synchronize() {
  return Cuda(api_->StreamSynchronize(stream_), "cudaStreamSynchronize(host staging)");
}

Status HostStagedExecutor::PackAllreduce(const std::vector<ReduceSlot>& slots, DataType dtype,
                                         double prescale, PackedReduction* out) {
  TFRING_RETURN_IF_ERROR(PackFused(slots, dtype, 1.0, out));
  TFRING_RETURN_IF_ERROR(Synchronize());  // the copies into host memory have landed
  return Scale(out->buffer, out->count, dtype, prescale);
}

Status HostStagedExecutor::PackReducescatter(const void* input, int64_t count, void* output,
                                             DataType dtype, double prescale, const void** send,
                                             void** recv) {
  (void)output;
  const int64_t bytes = count * DataTypeSize(dtype);
  void* in = PlaneBuffer(const_cast<void*>(input), 0, bytes);
  void* out = PlaneBuffer(output, 1, bytes);
  if (in == nullptr || out == nullptr) {
    return Status::Unknown("tfring: could not allocate " + std::to_string(bytes) +
                           " bytes of page-locked host memory to stage a reducescatter");
  }
  *send = in;
  *recv = out;
  TFRING_RETURN_IF_ERROR(Copy(in, input, bytes));
  TFRING_RETURN_IF_ERROR(Synchronize());
  return Scale(in, count, dtype, prescale);
}

}  // namespace tfring

#endif  // GPU build
