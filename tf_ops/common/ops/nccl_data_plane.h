// The NCCL data plane: collectives over device buffers, enqueued on a CUDA
// stream, completed asynchronously.
//
// Unlike the host planes (data_plane.h), a call here only enqueues work: it
// returns once NCCL has accepted the collective, with a GpuCompletion (a CUDA
// event recorded after the work) that the background thread polls with
// Poll(). Nothing here synchronises a stream.
//
// Communicators are made per (process set, device) on first use and cached;
// the NCCL unique id travels from the set's rank 0 through a callback the
// controller provides. Communicators are non-blocking (ncclConfig_t.blocking
// = 0), so every wait is a poll that also watches an abort flag: when the
// core learns that a peer died it calls RequestAbort(), and the next poll
// aborts the communicators (ncclCommAbort), which ends NCCL work that would
// otherwise wait forever for the dead peer.
//
// All NCCL/CUDA calls go through NcclApi (nccl_api.h), so this file needs
// neither nccl.h nor CUDA headers.
#ifndef TFRING_COMMON_OPS_NCCL_DATA_PLANE_H
#define TFRING_COMMON_OPS_NCCL_DATA_PLANE_H

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../common.h"
#include "../status.h"
#include "nccl_api.h"

namespace tfring {

// Broadcasts `*bytes` from rank 0 of the process set to all its members:
// rank 0 passes the bytes to send, the others receive them into `*bytes`.
// The controller provides it (it already talks to the set's ranks).
using BroadcastBytesFn = std::function<Status(std::string* bytes)>;

// An NCCL result as a Status. The Status code is the typed cause:
//   kInvalidArgument, kInvalidUsage      -> INVALID_ARGUMENT (this rank's call was wrong)
//   kRemoteError, kSystemError, kTimeout -> ABORTED (a peer or the network failed)
//   kUnhandledCudaError, kInternalError  -> UNKNOWN
// The message names the call and carries ncclGetErrorString and
// ncclGetLastError's text.
Status NcclResultToStatus(NcclResult result, const std::string& call,
                          const std::string& error_string, const std::string& last_error);
// A CUDA error (non-zero cudaError_t) as a Status (UNKNOWN) with CUDA's text.
Status CudaErrorToStatus(int error, const std::string& call, const std::string& error_string);

// Set by the core when the job is failing (a dead peer, shutdown); read by
// every poll of the NCCL plane.
class NcclAbortFlag {
 public:
  void Request(const std::string& reason);
  bool requested() const { return requested_.load(std::memory_order_acquire); }
  std::string reason() const;

 private:
  std::atomic<bool> requested_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

// The communicators of this process, keyed by (process set id, device).
class NcclCommunicators {
 public:
  // `init_timeout`: how long a communicator may take to form before the wait
  // gives up (and aborts it). The abort flag ends the wait sooner.
  NcclCommunicators(NcclApi* api, std::shared_ptr<NcclAbortFlag> abort,
                    std::chrono::milliseconds init_timeout = std::chrono::minutes(5));
  ~NcclCommunicators();
  NcclCommunicators(const NcclCommunicators&) = delete;
  NcclCommunicators& operator=(const NcclCommunicators&) = delete;

  // The communicator of `set_id` on `device`; created on first use, which is
  // collective over the set's ranks (each calls Get with the same set id).
  Status Get(int32_t set_id, int device, int rank, int size, const BroadcastBytesFn& broadcast,
             NcclComm* comm);
  // The cached communicator, or null (forms none).
  NcclComm Find(int32_t set_id, int device) const;
  // Destroys the communicators of a removed process set (set ids are reused).
  void Remove(int32_t set_id);
  // Aborts every communicator (pending NCCL work ends) and forgets them.
  void AbortAll();
  size_t size() const;

  // Waits, polling, until `comm` has finished the call that returned
  // kInProgress. Gives up on the abort flag, an async error or the deadline.
  Status WaitReady(NcclComm comm, const std::string& call, std::chrono::milliseconds timeout);
  // One poll: OK, InProgress, or the communicator's async error (after which
  // the communicator is aborted). The abort flag aborts everything.
  Status CheckAsync(NcclComm comm, const std::string& call);

  NcclApi* api() const { return api_; }
  const std::shared_ptr<NcclAbortFlag>& abort_flag() const { return abort_; }

 private:
  struct Entry {
    NcclComm comm = nullptr;
    int rank = -1;
    int size = 0;
  };
  Status Create(int device, int rank, int size, const BroadcastBytesFn& broadcast, Entry* entry);
  Status AbortedStatus() const;
  void AbortOne(NcclComm comm);

  NcclApi* api_;
  std::shared_ptr<NcclAbortFlag> abort_;
  std::chrono::milliseconds init_timeout_;
  mutable std::mutex mu_;
  std::map<std::pair<int32_t, int>, Entry> comms_;
};

// One tensor of a fused allreduce. `input` may be null: a rank that has
// joined contributes zeros for a tensor it never submitted (and `output` is
// then null too).
struct GpuTensor {
  const void* input = nullptr;
  void* output = nullptr;
  int64_t count = 0;  // elements
};

// Completion events are reused: creating one per collective costs more host
// time than a small collective itself.
class GpuEventPool {
 public:
  explicit GpuEventPool(NcclApi* api) : api_(api) {}
  ~GpuEventPool();
  int Acquire(GpuEvent* event);  // CUDA error code
  void Release(GpuEvent event);
  NcclApi* api() const { return api_; }

 private:
  NcclApi* api_;
  std::mutex mu_;
  std::vector<GpuEvent> free_;
};

// A collective in flight: poll it with NcclDataPlane::Poll until it is not
// InProgress. Movable, not copyable; releases its event when destroyed.
class GpuCompletion {
 public:
  GpuCompletion() = default;
  ~GpuCompletion();
  GpuCompletion(GpuCompletion&& other) noexcept;
  GpuCompletion& operator=(GpuCompletion&& other) noexcept;
  GpuCompletion(const GpuCompletion&) = delete;
  GpuCompletion& operator=(const GpuCompletion&) = delete;
  bool pending() const { return event_ != nullptr; }

 private:
  friend class NcclDataPlane;
  void Reset();
  std::shared_ptr<GpuEventPool> pool_;
  GpuEvent event_ = nullptr;
  NcclComm comm_ = nullptr;
  std::string what_;
};

// One process set's NCCL plane. Buffers are device pointers on `device`;
// work is enqueued on `stream` after whatever the caller enqueued there
// before (typically the kernel that produced the input). The fusion buffer
// is per device and reused by the next collective on that device, so a
// device's collectives must be enqueued on one stream (TF has one compute
// stream per GPU).
class NcclDataPlane {
 public:
  NcclDataPlane(NcclCommunicators* comms, int32_t set_id, int rank, int size,
                BroadcastBytesFn broadcast);
  ~NcclDataPlane();
  const char* name() const { return "NCCL"; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Reduces `count` elements of `send` into `recv` (send == recv: in place).
  // `op` may be AVERAGE; prescale is applied before the reduction and
  // postscale (and the division of AVERAGE) after it, with the semantics of
  // ScaleBuffer/FinishReduction (reduction.h), by kernels on `stream`.
  Status Allreduce(int device, GpuStream stream, const void* send, void* recv, int64_t count,
                   DataType dtype, ReduceOp op, double prescale, double postscale,
                   GpuCompletion* done);
  // Several tensors of one dtype reduced together: packed into the device's
  // fusion buffer (cudaMemcpyAsync), reduced once, unpacked. One tensor is
  // reduced in its output without a copy through the fusion buffer.
  Status FusedAllreduce(int device, GpuStream stream, const std::vector<GpuTensor>& tensors,
                        DataType dtype, ReduceOp op, double prescale, double postscale,
                        GpuCompletion* done);
  // Rank r contributes recv_bytes[r] bytes (may differ); concatenated in rank order.
  Status Allgather(int device, GpuStream stream, const void* send, void* recv,
                   const std::vector<int64_t>& recv_bytes, GpuCompletion* done);
  Status Broadcast(int device, GpuStream stream, void* buffer, int64_t bytes, int root,
                   GpuCompletion* done);
  Status Alltoall(int device, GpuStream stream, const void* send,
                  const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes, GpuCompletion* done);
  // Rank r keeps recv_counts[r] elements of the reduced `send`, in rank order.
  Status Reducescatter(int device, GpuStream stream, const void* send, void* recv,
                       const std::vector<int64_t>& recv_counts, DataType dtype, ReduceOp op,
                       double prescale, double postscale, GpuCompletion* done);

  // OK when the collective has finished on the GPU, InProgress while it
  // runs, or its error. Never blocks.
  Status Poll(GpuCompletion* done);

  // --- The executor's primitives (executor.h of the device-aware core): the
  // pack, scale and unpack steps on `stream`, for a GPU executor to forward
  // to, so that they share this plane's fusion buffer, kernels and errors.
  // The device's fusion buffer, at least `bytes` long (grows, never shrinks).
  Status DeviceFusionBuffer(int device, int64_t bytes, void** data);
  Status Copy(GpuStream stream, void* dst, const void* src, int64_t bytes);
  Status Zero(GpuStream stream, void* dst, int64_t bytes);
  // buf[i] *= factor (nothing when factor is 1).
  Status Scale(GpuStream stream, void* buf, int64_t count, DataType dtype, double factor);
  // Postscale and, for AVERAGE, division by `ranks` (FinishReduction's semantics).
  Status FinishReduction(GpuStream stream, void* buf, int64_t count, DataType dtype, ReduceOp op,
                         double postscale, int ranks);
  // A completion for everything queued on `stream` so far (the executor's
  // Fence): polled with Poll(), which also watches the set's communicator
  // on `device` (if formed) and the abort flag. Forms no communicator.
  Status Fence(int device, GpuStream stream, GpuCompletion* done);

  // The device fusion buffer's capacity in bytes (0 before first use).
  int64_t fusion_capacity(int device) const;
  // How many NCCL calls returned ncclInProgress and had to be waited for.
  int64_t in_progress_waits() const { return in_progress_waits_.load(); }

 private:
  struct DeviceBuffer {
    void* data = nullptr;
    int64_t capacity = 0;
  };
  Status Prepare(int device, NcclComm* comm);
  Status Check(NcclResult r, NcclComm comm, const std::string& call);
  Status Cuda(int error, const std::string& call);
  Status Finish(NcclComm comm, GpuStream stream, const std::string& what, GpuCompletion* done);
  Status FusionBuffer(int device, int64_t bytes, void** data);
  Status ScaleOnGpu(void* dst, const void* src, int64_t count, DataType dtype, double factor,
                    GpuStream stream);
  Status FinishOnGpu(void* buf, int64_t count, DataType dtype, ReduceOp op, double postscale,
                     int ranks, GpuStream stream);
  Status CheckReduction(DataType dtype, ReduceOp op, const char* collective) const;

  NcclCommunicators* comms_;
  NcclApi* api_;
  int32_t set_id_;
  int rank_, size_;
  BroadcastBytesFn broadcast_;
  std::map<int, DeviceBuffer> fusion_;
  std::shared_ptr<GpuEventPool> events_;
  std::atomic<int64_t> in_progress_waits_{0};
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_NCCL_DATA_PLANE_H
