#include "data_plane_selector.h"

#include <numeric>

namespace tfring {

DataPlaneSelector::DataPlaneSelector(std::unique_ptr<DataPlane> fallback,
                                     std::unique_ptr<DataPlane> shm,
                                     std::unique_ptr<DataPlane> cross_host,
                                     DataPlaneChoice choice)
    : fallback_(std::move(fallback)), shm_(std::move(shm)), cross_host_(std::move(cross_host)),
      choice_(choice), last_used_(fallback_->name()) {}

DataPlane* DataPlaneSelector::Select(CollectiveType type, int32_t device, int64_t bytes) {
  DataPlane* plane = fallback_.get();
  if (IsGpuDevice(device) && gpu_) {
    plane = gpu_.get();
  } else if (type == CollectiveType::ALLTOALL || type == CollectiveType::BARRIER) {
    // The fallback runs these: an alltoall's byte count differs between
    // ranks, so a choice by size could differ too, and a barrier has none.
  } else if (shm_ && bytes >= choice_.shm_min_bytes) {
    plane = shm_.get();
  } else if (cross_host_ && bytes >= choice_.cross_host_min_bytes) {
    plane = cross_host_.get();
  }
  last_used_ = plane->name();
  return plane;
}

// Called as a plane itself, the selector moves host memory only.
Status DataPlaneSelector::Allreduce(const void* input, void* output, int64_t count,
                                    DataType dtype, ReduceOp op) {
  return Select(CollectiveType::ALLREDUCE, kCpuDevice, count * DataTypeSize(dtype))
      ->Allreduce(input, output, count, dtype, op);
}

Status DataPlaneSelector::Allgather(const void* send, void* recv,
                                    const std::vector<int64_t>& recv_bytes) {
  const int64_t total = std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0});
  return Select(CollectiveType::ALLGATHER, kCpuDevice, total)->Allgather(send, recv, recv_bytes);
}

Status DataPlaneSelector::Broadcast(void* buffer, int64_t bytes, int root) {
  return Select(CollectiveType::BROADCAST, kCpuDevice, bytes)->Broadcast(buffer, bytes, root);
}

Status DataPlaneSelector::Alltoall(const void* send, const std::vector<int64_t>& send_bytes,
                                   void* recv, const std::vector<int64_t>& recv_bytes) {
  const int64_t total = std::accumulate(send_bytes.begin(), send_bytes.end(), int64_t{0});
  return Select(CollectiveType::ALLTOALL, kCpuDevice, total)
      ->Alltoall(send, send_bytes, recv, recv_bytes);
}

Status DataPlaneSelector::Reducescatter(const void* send, void* recv,
                                        const std::vector<int64_t>& recv_counts, DataType dtype,
                                        ReduceOp op) {
  const int64_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  return Select(CollectiveType::REDUCESCATTER, kCpuDevice, total * DataTypeSize(dtype))
      ->Reducescatter(send, recv, recv_counts, dtype, op);
}

Status DataPlaneSelector::Barrier() {
  return Select(CollectiveType::BARRIER, kCpuDevice, 0)->Barrier();
}

Status DataPlaneSelector::Adasum(void* buffer, const std::vector<int64_t>& counts,
                                 DataType dtype) {
  last_used_ = fallback_->name();
  return fallback_->Adasum(buffer, counts, dtype);
}

}  // namespace tfring
