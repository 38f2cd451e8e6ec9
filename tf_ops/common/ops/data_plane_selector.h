// Chooses, per collective, which data plane runs it. By device first: GPU
// tensors go to the GPU plane when one is registered; without one they take
// the host planes (host staged: their executor copies them to host memory and
// back). Then by size, among the host planes: the shared-memory plane for
// ranks on one host when the message is big enough to gain from it, the ring
// (or hierarchical) plane across hosts, and the fallback for everything else:
// the transport's own complete plane (MPI's), or a ring plane where the
// transport has none (see data_plane_factory.h).
// It is itself a (host) DataPlane, so code that only moves host bytes (e.g.
// the topology exchange at init) uses it as one plane; the core asks
// Select() which plane runs a collective and uses that plane's memory kind to
// pick the executor. last_used() names the latest choice (for the timeline).
#ifndef TFRING_COMMON_OPS_DATA_PLANE_SELECTOR_H
#define TFRING_COMMON_OPS_DATA_PLANE_SELECTOR_H

#include <atomic>
#include <memory>

#include "data_plane.h"

namespace tfring {

struct DataPlaneChoice {
  // Messages of at least this many bytes use `shm` (when present).
  int64_t shm_min_bytes = 0;
  // Messages of at least this many bytes use `cross_host` (when present).
  int64_t cross_host_min_bytes = 0;
};

class DataPlaneSelector : public DataPlane {
 public:
  // `fallback` is required and runs every collective; `shm` (all ranks on one
  // host) and `cross_host` (ring or hierarchical, ranks on several hosts) may
  // be null.
  DataPlaneSelector(std::unique_ptr<DataPlane> fallback, std::unique_ptr<DataPlane> shm,
                    std::unique_ptr<DataPlane> cross_host, DataPlaneChoice choice);

  const char* name() const override { return "selector"; }
  // The name of the plane that ran the most recent collective.
  const char* last_used() const override { return last_used_.load(); }
  void set_choice(const DataPlaneChoice& choice) { choice_ = choice; }
  // Registers the plane for GPU tensors (a GPU build's NCCL plane).
  void set_gpu(std::unique_ptr<DataPlane> gpu) { gpu_ = std::move(gpu); }
  bool has_gpu() const { return gpu_ != nullptr; }
  DataPlane* Select(CollectiveType type, int32_t device, int64_t bytes) override;
  const DataPlaneChoice& choice() const { return choice_; }
  bool has_shm() const { return shm_ != nullptr; }
  bool has_cross_host() const { return cross_host_ != nullptr; }

  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgather(const void* send, void* recv, const std::vector<int64_t>& recv_bytes) override;
  Status Broadcast(void* buffer, int64_t bytes, int root) override;
  Status Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes) override;
  Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  Status Barrier() override;
  // Always on the fallback plane (pairwise messages; see ops/adasum.h).
  Status Adasum(void* buffer, const std::vector<int64_t>& counts, DataType dtype) override;

 private:
  std::unique_ptr<DataPlane> fallback_, shm_, cross_host_, gpu_;
  DataPlaneChoice choice_;
  std::atomic<const char*> last_used_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_DATA_PLANE_SELECTOR_H
