// The hierarchical allreduce for GPU tensors of a process set spread over
// several hosts (TFRING_HIERARCHICAL_ALLREDUCE=1 in a GPU build): the three
// stages of the host planes' hierarchical allreduce
// (hierarchical_data_plane.cc), with NCCL inside each host and tfring's host
// ring across hosts:
//   1. an NCCL reduce-scatter among the host's ranks: local rank l gets
//      share l of the host's sum, on its GPU;
//   2. the share is copied to page-locked host memory, and lane l (the l-th
//      rank of every host) reduces it with the ring allreduce of the host
//      planes, which is tuned for the link between hosts and needs no NCCL
//      network support;
//   3. the share is copied back, and an NCCL allgather within the host puts
//      the shares together in the output.
// Inside a host NCCL uses the GPUs' own links; only 1/L of the data per rank
// (L ranks on a host) leaves the host, and it crosses once per lane.
//
// Stage 2 needs stage 1's result on the host, so the background thread waits
// for it, polling an event that also watches the communicator's errors and
// the abort flag. Stage 3 is queued on the executor's stream, behind which
// the executor's fence covers the whole collective as for any NCCL
// collective. The other collectives move each byte between two ranks once
// anyway: they run on NCCL over the whole set.
//
// Made in ops/cuda/gpu_setup.cc from the set's communicator; the plane itself
// sees only its parts, so it is unit-tested over the fake NCCL.
#ifndef TFRING_COMMON_OPS_HIERARCHICAL_GPU_DATA_PLANE_H
#define TFRING_COMMON_OPS_HIERARCHICAL_GPU_DATA_PLANE_H

#include <memory>
#include <string>
#include <vector>

#include "data_plane.h"
#include "gpu_executor.h"
#include "nccl_data_plane.h"

namespace tfring {

class HierarchicalGpuDataPlane : public DataPlane {
 public:
  struct Parts {
    std::unique_ptr<NcclDataPlane> flat;   // NCCL over the whole set
    std::unique_ptr<NcclDataPlane> local;  // NCCL over this host's ranks
    // The host plane of this rank's lane; null when the lane has this rank
    // alone (one host) or the rank has no lane (local rank >= lanes).
    std::unique_ptr<DataPlane> lane;
    // Planes the parts above use while they form (the host-local plane that
    // carries the local NCCL id), kept as long as they are.
    std::vector<std::unique_ptr<DataPlane>> keep;
    int local_rank = 0, local_size = 1, lanes = 1;
  };

  explicit HierarchicalGpuDataPlane(Parts parts);
  ~HierarchicalGpuDataPlane() override;

  const char* name() const override { return "NCCL_HIERARCHICAL"; }
  const char* last_used() const override { return last_used_; }
  bool on_gpu() const override { return true; }
  void Bind(const ExecutionContext& context) override;

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
  Status Barrier() override { return parts_.flat->Barrier(); }

 private:
  // Waits on the host for everything queued on the bound stream.
  Status AwaitStream(const std::string& what);
  Status Cuda(int error, const std::string& call);
  DataPlane* Flat();

  Parts parts_;
  NcclApi* api_;
  ExecutionContext context_;
  // The stream of the latest allreduce: its copy back from host_share_ may
  // still be queued when a collective on another stream reuses the buffer.
  void* last_stream_ = nullptr;
  bool last_stream_set_ = false;
  DeviceBuffer device_share_, host_share_;
  const char* last_used_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_HIERARCHICAL_GPU_DATA_PLANE_H
