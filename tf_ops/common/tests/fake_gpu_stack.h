// The executor's pipeline over a GPU executor on the fake NCCL/CUDA
// (fake_nccl.h), shared by the tests of the NCCL plane
// (nccl_data_plane_test.cc), the GPU executor (gpu_executor_test.cc) and
// the hierarchical GPU plane (hierarchical_gpu_data_plane_test.cc).
#ifndef TFRING_COMMON_TESTS_FAKE_GPU_STACK_H
#define TFRING_COMMON_TESTS_FAKE_GPU_STACK_H

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../executor.h"
#include "../ops/gpu_executor.h"
#include "../ops/nccl_data_plane.h"
#include "check.h"
#include "fake_nccl.h"

namespace tfring {
namespace test {

// Runs an allreduce through the executor's pipeline and polls its fence to
// the end; `ranks` divides an average.
inline Status AllreduceToEnd(Executor& executor, DataPlane& plane,
                             const std::vector<ReduceSlot>& slots, DataType dtype, ReduceOp op,
                             int ranks, double prescale = 1.0, double postscale = 1.0) {
  RunResult run = RunAllreduce(executor, plane, slots, dtype, op, prescale, postscale, ranks,
                               [](const std::string&, std::chrono::steady_clock::time_point) {});
  if (!run.status.in_progress()) return run.status;
  Status s;
  while ((s = run.pending->Query()).in_progress()) {
  }
  return s;
}

// A GPU executor over the fake NCCL/CUDA, with the communicators, abort
// flag and id broadcast that the planes of the rigs below use.
struct FakeGpuStack {
  FakeBroadcast bc;
  FakeApi api;
  std::shared_ptr<NcclAbortFlag> abort = std::make_shared<NcclAbortFlag>();
  NcclCommunicators comms{&api, abort};
  GpuShared shared;
  std::unique_ptr<Executor> executor;

  explicit FakeGpuStack(int device = 0) {
    shared.api = &api;
    shared.comms = &comms;
    shared.events = std::make_shared<GpuEventPool>(&api);
    CHECK(GpuExecutor::Create(&shared, device, &executor).ok());
  }
};

// The executor's pipeline (executor.h) over a GPU executor and the NCCL
// plane, as the core runs an allreduce: pack, scale and unpack in the
// executor, only the reduction in the plane.
struct GpuRig : FakeGpuStack {
  std::unique_ptr<NcclDataPlane> plane;

  explicit GpuRig(int size, int device = 0) : FakeGpuStack(device) {
    plane.reset(new NcclDataPlane(&comms, 0, 0, size, bc.fn()));
    plane->Bind(executor->context());
  }
  Status Allreduce(const std::vector<ReduceSlot>& slots, DataType dtype, ReduceOp op,
                   double prescale = 1.0, double postscale = 1.0) {
    return AllreduceToEnd(*executor, *plane, slots, dtype, op, plane->size(), prescale, postscale);
  }
};

}  // namespace test
}  // namespace tfring

#endif  // TFRING_COMMON_TESTS_FAKE_GPU_STACK_H
