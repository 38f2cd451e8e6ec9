// What a GPU build adds to the core, installed once when the library loads
// (ops/cuda/gpu_setup.cc), so that the core, the data-plane factory and the
// bindings never include CUDA or NCCL headers. In a CPU build nothing is
// installed and every entry point here says so with a clear error.
#ifndef TFRING_COMMON_GPU_SUPPORT_H
#define TFRING_COMMON_GPU_SUPPORT_H

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "device_event.h"
#include "status.h"

namespace tfring {

class Communicator;
class DataPlane;

// What the core tells a GPU build about a process set when it makes the
// set's GPU plane.
struct GpuPlaneRequest {
  // The set's communicator: rank i runs on hosts[i]. A plane with host-local
  // and cross-host parts (TFRING_HIERARCHICAL_ALLREDUCE) splits it.
  std::shared_ptr<Communicator> comm;
  std::vector<std::string> hosts;
  const Config* config = nullptr;
  // The set's host plane, which carries what the GPU plane must exchange
  // while it forms (NCCL's unique id).
  DataPlane* host = nullptr;
  // Makes the host plane (the ring) over a communicator split from `comm`,
  // so that the GPU build needs no host plane code of its own.
  std::function<Status(std::shared_ptr<Communicator> comm, std::unique_ptr<DataPlane>* out)>
      make_host_plane;
};

struct GpuSupport {
  // An event recorded now on `stream` (a cudaStream_t; null: the legacy
  // default stream) of GPU `device`: a binding hands it to Enqueue as the
  // entry's ready_event, so the request is only negotiated once the kernels
  // producing the input have run.
  std::function<Status(int32_t device, void* stream, std::shared_ptr<DeviceEvent>* out)>
      record_ready_event;
  // Collective over the set's ranks (each calls it at the same point of
  // making the set's planes): the plane for GPU tensors of the set that
  // `request` describes. Leaves *out null when GPU tensors must take the
  // host planes (host staging): TFRING_GPU_OPERATIONS=host, or more ranks on
  // a host than it has GPUs (NCCL refuses two ranks on one GPU).
  std::function<Status(const GpuPlaneRequest& request, std::unique_ptr<DataPlane>* out)>
      make_plane;
  // The job is failing or stopping: end every pending GPU collective (NCCL's
  // communicators are aborted) so that the events waiting on them happen.
  std::function<void(const std::string& reason)> abort_all;
  // Device-to-host copies made by host staging since the library loaded
  // (tests use it to show that a tensor never left its GPU).
  std::function<int64_t()> host_copies;
};

// Installs the GPU build's support (once, at load).
void SetGpuSupport(GpuSupport support);
// Whether this library was built with GPU (NCCL) support.
bool GpuBuilt();
// The installed support's record_ready_event, or an InvalidArgument naming
// the missing GPU support.
Status RecordReadyEvent(int32_t device, void* stream, std::shared_ptr<DeviceEvent>* out);
// The installed support's make_plane; OK with *out null in a CPU build.
Status MakeGpuPlane(const GpuPlaneRequest& request, std::unique_ptr<DataPlane>* out);
// Calls the installed abort_all (nothing in a CPU build).
void AbortGpuWork(const std::string& reason);
// Device-to-host staging copies so far (0 in a CPU build).
int64_t HostStagingCopies();

}  // namespace tfring

#endif  // TFRING_COMMON_GPU_SUPPORT_H
