// Installs a GPU build's pieces into the core when the library loads: the
// executor factory (executor.h) and the GpuSupport hooks (gpu_support.h).
// Compiled only into a GPU build (TFRING_WITH_NCCL); the CPU library's source
// glob picks this file up, and it then compiles to nothing.
#ifdef TFRING_WITH_NCCL

#include <algorithm>
#include <atomic>
#include <cstring>

#include "../../executor.h"
#include "../../gpu_support.h"
#include "../../logging.h"
#include "../gpu_executor.h"
#include "../hierarchical_gpu_data_plane.h"
#include "../host_layout.h"
#include "../nccl_data_plane.h"
#include "../../transport/communicator.h"
#include "cuda_nccl_api.h"

namespace tfring {
namespace {

// One per process, never destroyed: executors and planes of sets that are
// being torn down at exit may still use it.
struct GpuGlobals {
  std::unique_ptr<NcclApi> api = CreateCudaNcclApi();
  std::unique_ptr<NcclCommunicators> comms{
      new NcclCommunicators(api.get(), std::make_shared<NcclAbortFlag>())};
  GpuShared shared;
  std::atomic<int32_t> next_key{1};

  GpuGlobals() {
    shared.api = api.get();
    shared.comms = comms.get();
    shared.events = std::make_shared<GpuEventPool>(api.get());
  }
};

GpuGlobals& G() {
  static GpuGlobals* g = new GpuGlobals();
  return *g;
}

Status RecordReady(int32_t device, void* stream, std::shared_ptr<DeviceEvent>* out) {
  return GpuReadyEvent::Record(&G().shared, device, stream, out);
}

// NCCL's unique id over the set's host plane: one length byte, then the id.
BroadcastBytesFn BroadcastOver(DataPlane* host) {
  return [host](std::string* bytes) {
    std::string buf(1 + kNcclUniqueIdBytes, '\0');
    if (bytes->size() == kNcclUniqueIdBytes) {
      buf[0] = 1;
      std::memcpy(&buf[1], bytes->data(), kNcclUniqueIdBytes);
    }
    TFRING_RETURN_IF_ERROR(host->Broadcast(&buf[0], static_cast<int64_t>(buf.size()), 0));
    bytes->assign(buf[0] ? buf.substr(1) : std::string());
    return Status::OK();
  };
}

// The hierarchical GPU plane's parts (hierarchical_gpu_data_plane.h), made
// from the set's communicator: collective over it, in the same order on
// every rank.
Status MakeHierarchicalPlane(const GpuPlaneRequest& request, std::unique_ptr<DataPlane>* out) {
  GpuGlobals& g = G();
  const std::shared_ptr<Communicator>& comm = request.comm;
  const std::vector<std::string>& hosts = request.hosts;
  const int rank = comm->rank();
  const HostLayout layout = LayOutHosts(hosts, rank);
  HierarchicalGpuDataPlane::Parts parts;
  parts.local_rank = layout.local_rank;
  parts.local_size = layout.local_size;
  parts.lanes = layout.lanes;
  std::shared_ptr<Communicator> local_comm, lane_comm;
  TFRING_RETURN_IF_ERROR(comm->Split(layout.host, rank, &local_comm));
  // Ranks beyond the lanes pass a negative color: they get no lane.
  TFRING_RETURN_IF_ERROR(comm->Split(layout.local_rank < layout.lanes ? layout.local_rank : -1,
                                     rank, &lane_comm));
  if (!local_comm) {
    return Status::Aborted("tfring: splitting the host-local communicator gave rank " +
                           std::to_string(rank) + " none");
  }
  // The host-local ring carries the local communicator's NCCL id; the lane's
  // ring is the cross-host stage.
  std::unique_ptr<DataPlane> local_host;
  TFRING_RETURN_IF_ERROR(request.make_host_plane(local_comm, &local_host));
  if (lane_comm && lane_comm->size() > 1) {
    TFRING_RETURN_IF_ERROR(request.make_host_plane(lane_comm, &parts.lane));
  }
  parts.flat.reset(new NcclDataPlane(g.comms.get(), g.next_key.fetch_add(1), rank, comm->size(),
                                     BroadcastOver(request.host)));
  parts.local.reset(new NcclDataPlane(g.comms.get(), g.next_key.fetch_add(1), layout.local_rank,
                                      layout.local_size, BroadcastOver(local_host.get())));
  parts.keep.push_back(std::move(local_host));
  TFRING_LOG(DEBUG) << "hierarchical GPU plane: rank " << rank << ", host " << layout.host
                    << " of " << layout.hosts << ", local rank " << layout.local_rank << " of "
                    << layout.local_size << ", " << layout.lanes << " lane(s)";
  out->reset(new HierarchicalGpuDataPlane(std::move(parts)));
  return Status::OK();
}

Status MakePlane(const GpuPlaneRequest& request, std::unique_ptr<DataPlane>* out) {
  out->reset();
  const Config& config = *request.config;
  const std::vector<std::string>& hosts = request.hosts;
  DataPlane* host = request.host;
  const int rank = request.comm->rank(), size = request.comm->size();
  if (config.gpu_operations == "host") return Status::OK();
  GpuGlobals& g = G();
  // NCCL refuses two ranks on one GPU: it is used when every rank on each
  // host can have a GPU of its own, which all ranks must agree on.
  int devices = 0;
  const int err = g.api->GetDeviceCount(&devices);
  const int on_my_host = static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[rank]));
  uint8_t mine = err == 0 && devices >= on_my_host ? 1 : 0;
  std::vector<uint8_t> all(size, 0);
  TFRING_RETURN_IF_ERROR(host->Allgather(&mine, all.data(), std::vector<int64_t>(size, 1)));
  if (std::find(all.begin(), all.end(), 0) != all.end()) {
    if (config.gpu_operations == "nccl") {
      TFRING_LOG(WARNING) << "TFRING_GPU_OPERATIONS=nccl, but some host runs more ranks than it "
                             "has GPUs (NCCL refuses two ranks on one GPU); GPU tensors are "
                             "staged through the host planes";
    }
    return Status::OK();
  }
  // A new job after a failed one: its communicators are gone with it.
  if (g.comms->size() == 0) g.comms->abort_flag()->Clear();
  // Every rank sees the same hosts and settings, so all choose alike.
  const bool one_host = std::all_of(hosts.begin(), hosts.end(),
                                    [&](const std::string& h) { return h == hosts[0]; });
  if (config.hierarchical_allreduce && !one_host) {
    return MakeHierarchicalPlane(request, out);
  }
  out->reset(new NcclDataPlane(g.comms.get(), g.next_key.fetch_add(1), rank, size,
                               BroadcastOver(host)));
  return Status::OK();
}

bool Install() {
  SetGpuExecutorFactory([](int32_t device, bool host_staged, std::unique_ptr<Executor>* out) {
    return host_staged ? HostStagedExecutor::Create(&G().shared, device, out)
                       : GpuExecutor::Create(&G().shared, device, out);
  });
  GpuSupport support;
  support.record_ready_event = RecordReady;
  support.make_plane = MakePlane;
  support.abort_all = [](const std::string& reason) {
    G().comms->abort_flag()->Request(reason);
    G().comms->AbortAll();
  };
  support.host_copies = []() { return G().shared.staged_copies.load(); };
  SetGpuSupport(std::move(support));
  return true;
}

const bool installed = Install();

}  // namespace
}  // namespace tfring

#endif  // GPU build
