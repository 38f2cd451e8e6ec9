#include "gpu_support.h"

#include <mutex>

#include "common.h"
#include "ops/data_plane.h"

namespace tfring {

namespace {

std::mutex& Mutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

GpuSupport& Installed() {
  static GpuSupport* support = new GpuSupport();
  return *support;
}

GpuSupport Current() {
  std::lock_guard<std::mutex> lock(Mutex());
  return Installed();
}

}  // namespace

void SetGpuSupport(GpuSupport support) {
  std::lock_guard<std::mutex> lock(Mutex());
  Installed() = std::move(support);
}

bool GpuBuilt() { return static_cast<bool>(Current().make_plane); }

Status RecordReadyEvent(int32_t device, void* stream, std::shared_ptr<DeviceEvent>* out) {
  GpuSupport s = Current();
  if (!s.record_ready_event) {
    return Status::InvalidArgument(
        "tfring: this build has no GPU support, so it cannot take tensors on " +
        DeviceName(device) + "; place them on the CPU, or build tfring with CUDA "
        "(TFRING_WITH_NCCL=1)");
  }
  return s.record_ready_event(device, stream, out);
}

Status MakeGpuPlane(const GpuPlaneRequest& request, std::unique_ptr<DataPlane>* out) {
  out->reset();
  GpuSupport s = Current();
  if (!s.make_plane) return Status::OK();
  return s.make_plane(request, out);
}

void AbortGpuWork(const std::string& reason) {
  GpuSupport s = Current();
  if (s.abort_all) s.abort_all(reason);
}

int64_t HostStagingCopies() {
  GpuSupport s = Current();
  return s.host_copies ? s.host_copies() : 0;
}

}  // namespace tfring
