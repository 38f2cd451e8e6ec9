// A data plane moves tensor bytes between the ranks of one process set. The
// core decides what to run and in which order; a data plane only runs it.
// All calls are collective over the set and made from the background thread.
//
// A plane works either in host memory or in GPU memory (on_gpu()). A CPU
// plane finishes each call before returning. A GPU plane may instead queue
// the collective on the stream of its executor (executor.h) and return
// Status::InProgress: the executor's Fence() then covers it, and the core
// polls that event rather than waiting.
#ifndef TFRING_COMMON_OPS_DATA_PLANE_H
#define TFRING_COMMON_OPS_DATA_PLANE_H

#include <cstdint>
#include <string>
#include <vector>

#include "../common.h"
#include "../status.h"

namespace tfring {

// Where the next collective's buffers live and on which stream its work is
// queued: the executor's (executor.h). Host planes ignore it.
struct ExecutionContext {
  int32_t device = kCpuDevice;
  void* stream = nullptr;  // a cudaStream_t on a GPU
};

// One tensor of a reduction as this rank sees it.
struct ReduceSlot {
  const void* input = nullptr;  // null: this rank contributes zeros (it has joined)
  void* output = nullptr;       // null: nothing to write back (idem)
  int64_t count = 0;            // elements
};

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  virtual const char* name() const = 0;
  // The plane that ran the latest collective (itself, unless it delegates).
  virtual const char* last_used() const { return name(); }
  // Whether this plane reads and writes GPU memory (else host memory).
  virtual bool on_gpu() const { return false; }
  // Called before each collective that this plane runs, with the context of
  // the executor that packs its tensors (a GPU plane queues its work on that
  // executor's stream, so that the executor's Fence() covers it).
  virtual void Bind(const ExecutionContext& context) { (void)context; }
  // The plane that will run a `type` collective of `bytes` on tensors on
  // `device`. A plane that delegates (the selector) names one of its planes;
  // any other plane runs everything itself.
  virtual DataPlane* Select(CollectiveType type, int32_t device, int64_t bytes) {
    (void)type;
    (void)device;
    (void)bytes;
    return this;
  }

  // Reduces `count` elements of `input` across ranks into `output`. The
  // plane reads the input and writes the output directly: nobody stages a
  // copy of the input in the output first (at 64 MB that copy alone was a
  // third of the time). `output` may be `input` (in place); otherwise the
  // two must not overlap, and the input is left as it was. `op` is SUM,
  // MIN, MAX or PRODUCT: averaging and scaling are the core's job.
  virtual Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  // In place over `count` elements.
  Status Allreduce(void* buffer, int64_t count, DataType dtype, ReduceOp op) {
    return Allreduce(buffer, buffer, count, dtype, op);
  }
  // Rank r contributes recv_bytes[r] bytes; results are concatenated in rank order.
  virtual Status Allgather(const void* send, void* recv, const std::vector<int64_t>& recv_bytes) = 0;
  virtual Status Broadcast(void* buffer, int64_t bytes, int root) = 0;
  // Whether BroadcastOutOfPlace() is implemented. A plane that can fuse the
  // root's copy of its input into the collective says so; for the others the
  // caller copies the root's input to its output and broadcasts in place
  // (at 64 MB that extra pass over memory cost as much as the broadcast).
  virtual bool broadcasts_out_of_place() const { return false; }
  // The root's `input` lands in `output` on every rank, the root's included.
  // Only the root reads `input`; `output` may be `input` (in place),
  // otherwise the two must not overlap.
  virtual Status BroadcastOutOfPlace(const void* input, void* output, int64_t bytes, int root) {
    (void)input;
    (void)output;
    (void)bytes;
    (void)root;
    return Status::InvalidArgument(std::string("tfring: the ") + name() +
                                   " data plane broadcasts in place only");
  }
  // send_bytes[r] bytes go to rank r; recv_bytes[r] bytes come from rank r.
  virtual Status Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                          const std::vector<int64_t>& recv_bytes) = 0;
  // Reduces `send` across ranks; rank r keeps recv_counts[r] elements of the
  // result, in rank order.
  virtual Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                               DataType dtype, ReduceOp op) = 0;
  virtual Status Barrier() = 0;
  // Whether AllreduceGroup() is implemented. A plane that can reduce several
  // tensors in one call, each from its own input into its own output, spares
  // the executor the copies into and out of the fusion buffer: NCCL runs a
  // group of allreduces as one launch, and at np=1 on a GPU those two copies
  // took twice as long as the allreduce itself.
  virtual bool reduces_groups() const { return false; }
  // Reduces each of `tensors` (every input and output present; inputs and
  // outputs as for Allreduce) across ranks, as one collective. `op` as for
  // Allreduce.
  virtual Status AllreduceGroup(const std::vector<ReduceSlot>& tensors, DataType dtype,
                                ReduceOp op) {
    (void)tensors;
    (void)dtype;
    (void)op;
    return Status::InvalidArgument(std::string("tfring: the ") + name() +
                                   " data plane reduces one buffer at a time");
  }
  // Adasum (ops/adasum.h) in place over tensors of counts[i] elements laid
  // out back to back. Planes that cannot run it say so.
  virtual Status Adasum(void* buffer, const std::vector<int64_t>& counts, DataType dtype) {
    return Status::InvalidArgument(std::string("tfring: the ") + name() +
                                   " data plane cannot run Adasum");
  }
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_DATA_PLANE_H
