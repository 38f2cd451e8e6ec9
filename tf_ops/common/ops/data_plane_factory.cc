#include "data_plane_factory.h"

#include <algorithm>

#include "../gpu_support.h"
#include "../logging.h"
#include "data_plane_selector.h"
#include "ring_data_plane.h"
#include "shm_data_plane.h"

namespace tfring {

std::unique_ptr<DataPlane> MakeDataPlane(const std::shared_ptr<Communicator>& comm,
                                         std::unique_ptr<DataPlane> fallback,
                                         const std::vector<std::string>& hosts,
                                         const Config& config, int job_rank) {
  if (!fallback) {
    Status s = CreateRingDataPlane(comm, &fallback, config.allreduce_algorithm);
    if (!s.ok()) {
      TFRING_LOG(ERROR) << "no data plane could be made for a process set: " << s.message();
      return nullptr;
    }
  }
  std::unique_ptr<DataPlane> shm, cross_host;
  const std::string& ops = config.cpu_operations;
  const bool known = !hosts.empty() && comm->size() > 1;
  const bool one_host =
      known && std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) {
        return h == hosts[0];
      });
  // Every rank of the set sees the same hosts, so all make the same choices
  // and take part in the same collective set-up calls.
  if (one_host && (ops == "auto" || ops == "shm")) {
    ShmOptions options;
    options.single_copy = config.shm_single_copy;
    options.single_copy_min_bytes = config.shm_single_copy_min_bytes;
    options.job_rank = job_rank;
    Status s = CreateShmDataPlane(comm->rank(), comm->size(), fallback.get(), comm->monitor(),
                                  options, &shm);
    if (!s.ok()) {
      TFRING_LOG(WARNING) << "shared-memory data plane unavailable, using the "
                          << fallback->name() << " plane: " << s.message();
      shm.reset();
    }
  }
  if (known && ((!one_host && ops == "auto") || ops == "ring")) {
    Status s = config.hierarchical_allreduce && !one_host
                   ? CreateHierarchicalDataPlane(comm, hosts, &cross_host,
                                                 config.allreduce_algorithm)
                   : CreateRingDataPlane(comm, &cross_host, config.allreduce_algorithm);
    if (!s.ok()) {
      TFRING_LOG(WARNING) << "cross-host data plane unavailable, using the " << fallback->name()
                          << " plane: " << s.message();
      cross_host.reset();
    }
  }
  // A GPU build's plane for GPU tensors (NCCL), once the hosts are known
  // (one rank alone on its GPU needs one too). Without it, GPU tensors are
  // staged through the host planes.
  std::unique_ptr<DataPlane> gpu;
  if (!hosts.empty()) {
    GpuPlaneRequest request;
    request.comm = comm;
    request.hosts = hosts;
    request.config = &config;
    request.host = fallback.get();
    request.make_host_plane = [](std::shared_ptr<Communicator> c, std::unique_ptr<DataPlane>* p) {
      return CreateRingDataPlane(std::move(c), p);
    };
    Status s = MakeGpuPlane(request, &gpu);
    if (!s.ok()) {
      TFRING_LOG(WARNING) << "GPU data plane unavailable, GPU tensors are staged through the "
                          << fallback->name() << " plane: " << s.message();
      gpu.reset();
    }
  }
  DataPlaneChoice choice;
  choice.shm_min_bytes = config.shm_min_bytes;
  choice.cross_host_min_bytes = config.cross_host_min_bytes;
  auto selector =
      new DataPlaneSelector(std::move(fallback), std::move(shm), std::move(cross_host), choice);
  if (gpu) selector->set_gpu(std::move(gpu));
  return std::unique_ptr<DataPlane>(selector);
}

}  // namespace tfring
