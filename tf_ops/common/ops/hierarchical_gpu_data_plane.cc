// Compiled only into a GPU build (TFRING_WITH_NCCL) and into its unit test
// (TFRING_NCCL_PLANE_LOGIC, tests/common/test_nccl_cpp.py); the CPU
// library's source glob picks this file up, and it then compiles to nothing.
#if defined(TFRING_WITH_NCCL) || defined(TFRING_NCCL_PLANE_LOGIC)

#include "hierarchical_gpu_data_plane.h"

#include <algorithm>
#include <thread>

#include "host_layout.h"

namespace tfring {

HierarchicalGpuDataPlane::HierarchicalGpuDataPlane(Parts parts)
    : parts_(std::move(parts)),
      api_(parts_.local->api()),
      device_share_(api_, false),
      host_share_(api_, true),
      last_used_(name()) {}

// The shares are freed by cudaFree/cudaFreeHost, which wait for the device:
// a copy still queued from the page-locked share finishes first.
HierarchicalGpuDataPlane::~HierarchicalGpuDataPlane() = default;

void HierarchicalGpuDataPlane::Bind(const ExecutionContext& context) {
  context_ = context;
  parts_.flat->Bind(context);
  parts_.local->Bind(context);
}

Status HierarchicalGpuDataPlane::Cuda(int error, const std::string& call) {
  return error == 0 ? Status::OK() : CudaErrorToStatus(error, call, api_->CudaErrorString(error));
}

Status HierarchicalGpuDataPlane::AwaitStream(const std::string& what) {
  GpuCompletion done;
  TFRING_RETURN_IF_ERROR(parts_.local->Mark(context_.device, context_.stream, what, &done));
  // A device-to-host copy of one share takes microseconds to milliseconds:
  // spin briefly, then poll with short sleeps so that a long stage does not
  // hold a core.
  Status s;
  for (int polls = 0; (s = parts_.local->Poll(&done)).in_progress(); ++polls) {
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  return s;
}

DataPlane* HierarchicalGpuDataPlane::Flat() {
  last_used_ = parts_.flat->name();
  return parts_.flat.get();
}

Status HierarchicalGpuDataPlane::Allreduce(const void* input, void* output, int64_t count,
                                           DataType dtype, ReduceOp op) {
  last_used_ = name();
  if (op != ReduceOp::SUM && op != ReduceOp::MIN && op != ReduceOp::MAX &&
      op != ReduceOp::PRODUCT) {
    return Status::InvalidArgument(
        std::string("tfring: the hierarchical GPU plane cannot run allreduce with reduce op ") +
        ReduceOpName(op));
  }
  if (count <= 0) return Status::OK();
  const int64_t esize = DataTypeSize(dtype);
  const std::vector<int64_t> counts =
      LaneShares(count, parts_.lanes, parts_.local_size);
  const int64_t mine = counts[parts_.local_rank];
  const int device = context_.device;
  GpuStream stream = context_.stream;
  if (last_stream_set_ && last_stream_ != stream) {
    TFRING_RETURN_IF_ERROR(Cuda(api_->StreamSynchronize(last_stream_),
                                "cudaStreamSynchronize(previous hierarchical allreduce)"));
  }
  last_stream_ = stream;
  last_stream_set_ = true;

  int err = 0;
  void* share = device_share_.Get(std::max<int64_t>(1, mine * esize), &err);
  TFRING_RETURN_IF_ERROR(Cuda(err, "cudaMalloc(hierarchical allreduce share)"));
  Status s = parts_.local->Reducescatter(device, stream, input, share, counts, dtype, op, nullptr);
  if (!s.ok() && !s.in_progress()) return s;
  if (parts_.lane && mine > 0) {
    void* host = host_share_.Get(mine * esize, &err);
    TFRING_RETURN_IF_ERROR(Cuda(err, "cudaMallocHost(hierarchical allreduce share)"));
    TFRING_RETURN_IF_ERROR(Cuda(api_->MemcpyAsync(host, share, mine * esize, stream),
                                "cudaMemcpyAsync(share to host)"));
    TFRING_RETURN_IF_ERROR(AwaitStream("hierarchical allreduce (within the host)"));
    TFRING_RETURN_IF_ERROR(parts_.lane->Allreduce(host, mine, dtype, op));
    TFRING_RETURN_IF_ERROR(Cuda(api_->MemcpyAsync(share, host, mine * esize, stream),
                                "cudaMemcpyAsync(share to the GPU)"));
  }
  std::vector<int64_t> bytes(counts.size());
  for (size_t l = 0; l < counts.size(); ++l) bytes[l] = counts[l] * esize;
  return parts_.local->Allgather(device, stream, share, output, bytes, nullptr);
}

Status HierarchicalGpuDataPlane::Allgather(const void* send, void* recv,
                                           const std::vector<int64_t>& recv_bytes) {
  return Flat()->Allgather(send, recv, recv_bytes);
}

Status HierarchicalGpuDataPlane::Broadcast(void* buffer, int64_t bytes, int root) {
  return Flat()->Broadcast(buffer, bytes, root);
}

Status HierarchicalGpuDataPlane::BroadcastOutOfPlace(const void* input, void* output,
                                                     int64_t bytes, int root) {
  return Flat()->BroadcastOutOfPlace(input, output, bytes, root);
}

Status HierarchicalGpuDataPlane::Alltoall(const void* send, const std::vector<int64_t>& send_bytes,
                                          void* recv, const std::vector<int64_t>& recv_bytes) {
  return Flat()->Alltoall(send, send_bytes, recv, recv_bytes);
}

Status HierarchicalGpuDataPlane::Reducescatter(const void* send, void* recv,
                                               const std::vector<int64_t>& recv_counts,
                                               DataType dtype, ReduceOp op) {
  return Flat()->Reducescatter(send, recv, recv_counts, dtype, op);
}

}  // namespace tfring

#endif  // GPU build
