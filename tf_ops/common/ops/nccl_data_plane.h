// The NCCL data plane: collectives over device buffers, queued on the
// stream of the GPU executor that packed them (ops/gpu_executor.h), which
// also owns pack, scale and unpack. A call returns once NCCL has accepted the
// collective (Status::InProgress through the DataPlane interface); the
// executor's Fence() then covers it, and nothing here synchronises a stream.
//
// Communicators are made per (plane, device) on first use and cached; the
// NCCL unique id travels from the set's rank 0 over the set's host plane.
// Communicators are non-blocking (ncclConfig_t.blocking = 0), so every wait
// is a poll that also watches an abort flag: when the core learns that a peer
// died it aborts them (ncclCommAbort), which ends NCCL work that would
// otherwise wait forever for the dead peer.
//
// All NCCL/CUDA calls go through NcclApi (nccl_api.h), so this file needs
// neither nccl.h nor CUDA headers.
#ifndef TFRING_COMMON_OPS_NCCL_DATA_PLANE_H
#define TFRING_COMMON_OPS_NCCL_DATA_PLANE_H

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../common.h"
#include "../status.h"
#include "data_plane.h"
#include "nccl_api.h"
#include "nccl_communicators.h"

namespace tfring {

// One process set's NCCL plane. Buffers are device pointers; the explicit
// methods take the device and stream, the DataPlane ones use what Bind()
// gave (the executor's). A communicator is keyed by `key` (unique per plane)
// and device, and destroyed with the plane.
class NcclDataPlane : public DataPlane {
 public:
  NcclDataPlane(NcclCommunicators* comms, int32_t key, int rank, int size,
                BroadcastBytesFn broadcast);
  ~NcclDataPlane() override;
  const char* name() const override { return "NCCL"; }
  bool on_gpu() const override { return true; }
  void Bind(const ExecutionContext& context) override { context_ = context; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  NcclApi* api() const { return api_; }

  // --- DataPlane: on the bound device and stream; InProgress once queued.
  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgather(const void* send, void* recv, const std::vector<int64_t>& recv_bytes) override;
  Status Broadcast(void* buffer, int64_t bytes, int root) override;
  bool broadcasts_out_of_place() const override { return true; }
  Status BroadcastOutOfPlace(const void* input, void* output, int64_t bytes, int root) override;
  Status Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes) override;
  Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  // One ncclAllReduce per tensor inside one NCCL group, which NCCL runs as
  // a single launch.
  bool reduces_groups() const override { return true; }
  Status AllreduceGroup(const std::vector<ReduceSlot>& tensors, DataType dtype,
                        ReduceOp op) override;
  // Barriers run on the host planes (the selector never sends one here).
  Status Barrier() override;

  // --- The same collectives with an explicit device and stream. `done`
  // (may be null) receives an event recorded after the work, to Poll().
  // Reduces `count` elements of `send` into `recv` (send == recv: in place);
  // `op` is SUM, MIN, MAX or PRODUCT (the executor averages and scales).
  Status Allreduce(int device, GpuStream stream, const void* send, void* recv, int64_t count,
                   DataType dtype, ReduceOp op, GpuCompletion* done);
  // Rank r contributes recv_bytes[r] bytes (may differ); concatenated in rank order.
  Status Allgather(int device, GpuStream stream, const void* send, void* recv,
                   const std::vector<int64_t>& recv_bytes, GpuCompletion* done);
  // The root's `send` lands in `recv` on every rank (send == recv: in place).
  Status Broadcast(int device, GpuStream stream, const void* send, void* recv, int64_t bytes,
                   int root, GpuCompletion* done);
  Status Alltoall(int device, GpuStream stream, const void* send,
                  const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes, GpuCompletion* done);
  // Rank r keeps recv_counts[r] elements of the reduced `send`, in rank order.
  Status Reducescatter(int device, GpuStream stream, const void* send, void* recv,
                       const std::vector<int64_t>& recv_counts, DataType dtype, ReduceOp op,
                       GpuCompletion* done);

  // Records into `done` an event after everything queued so far on `stream`
  // (this plane's collectives included). A caller that must wait on the host
  // for queued NCCL work (the hierarchical GPU plane's cross-host stage)
  // polls it, so that its wait watches the communicator's errors and the
  // abort flag rather than blocking on the stream.
  Status Mark(int device, GpuStream stream, const std::string& what, GpuCompletion* done);
  // OK when the collective has finished on the GPU, InProgress while it
  // runs, or its error. Never blocks.
  Status Poll(GpuCompletion* done);
  // How many NCCL calls returned ncclInProgress and had to be waited for.
  int64_t in_progress_waits() const { return in_progress_waits_.load(); }

 private:
  Status Prepare(int device, NcclComm* comm);
  Status Check(NcclResult r, NcclComm comm, const std::string& call);
  Status Cuda(int error, const std::string& call);
  // `done` null: the work is queued and the caller's fence covers it
  // (InProgress); else an event is recorded into `done` (OK).
  Status Finish(NcclComm comm, GpuStream stream, const std::string& what, GpuCompletion* done);
  Status CheckReduction(DataType dtype, ReduceOp op, const char* collective) const;

  NcclCommunicators* comms_;
  NcclApi* api_;
  int32_t key_;
  int rank_, size_;
  BroadcastBytesFn broadcast_;
  ExecutionContext context_;
  std::shared_ptr<GpuEventPool> events_;
  std::atomic<int64_t> in_progress_waits_{0};
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_NCCL_DATA_PLANE_H
