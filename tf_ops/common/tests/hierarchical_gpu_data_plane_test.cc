// Unit tests of the hierarchical GPU plane (ops/hierarchical_gpu_data_plane.*)
// over a fake NCCL/CUDA on host memory (fake_nccl.h) and a fake cross-host
// lane, seen from one rank: the within-host and cross-host stages and
// their shares (even, uneven, a rank beyond the lanes), a peer failing
// within the host, and the collectives it leaves to NCCL over the whole
// set. Built and run by tests/common/test_nccl_cpp.py (ASan/UBSan) and by
// Bazel as //tf_ops:hierarchical_gpu_data_plane_test.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../ops/data_plane.h"
#include "../ops/hierarchical_gpu_data_plane.h"
#include "../ops/nccl_data_plane.h"
#include "../reduction.h"
#include "check.h"
#include "fake_gpu_stack.h"
#include "fake_nccl.h"

using namespace tfring;
using namespace tfring::test;

namespace {

// The cross-host stage of the hierarchical GPU plane, seen from one rank:
// acts as if the same rank on each of `hosts` hosts held the same share.
class FakeLane : public DataPlane {
 public:
  explicit FakeLane(int hosts) : hosts_(hosts) {}
  const char* name() const override { return "fake lane"; }
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override {
    counts.push_back(count);
    const int64_t bytes = count * DataTypeSize(dtype);
    std::vector<char> orig(static_cast<const char*>(input), static_cast<const char*>(input) + bytes);
    std::memcpy(output, orig.data(), bytes);
    for (int i = 1; i < hosts_; ++i) ReduceInto(output, orig.data(), count, dtype, op);
    return Status::OK();
  }
  Status Allgather(const void*, void*, const std::vector<int64_t>&) override { return Fail(); }
  Status Broadcast(void*, int64_t, int) override { return Fail(); }
  Status Alltoall(const void*, const std::vector<int64_t>&, void*,
                  const std::vector<int64_t>&) override {
    return Fail();
  }
  Status Reducescatter(const void*, void*, const std::vector<int64_t>&, DataType,
                       ReduceOp) override {
    return Fail();
  }
  Status Barrier() override { return Fail(); }
  std::vector<int64_t> counts;  // elements of each allreduce it ran

 private:
  static Status Fail() { return Status::InvalidArgument("the lane only reduces"); }
  int hosts_;
};

// One rank of the hierarchical GPU plane over the fake NCCL: local rank
// `local_rank` of `local_size` on each of `hosts` hosts, `lanes` lanes.
struct HierarchicalRig : FakeGpuStack {
  std::unique_ptr<HierarchicalGpuDataPlane> plane;
  FakeLane* lane = nullptr;
  int ranks;

  HierarchicalRig(int hosts, int local_rank, int local_size, int lanes)
      : ranks(hosts * local_size) {
    bc.rank = local_rank;  // the flat plane's rank too, here
    HierarchicalGpuDataPlane::Parts parts;
    parts.flat.reset(new NcclDataPlane(&comms, 1, local_rank, ranks, bc.fn()));
    parts.local.reset(new NcclDataPlane(&comms, 2, local_rank, local_size, bc.fn()));
    if (local_rank < lanes) {
      lane = new FakeLane(hosts);
      parts.lane.reset(lane);
    }
    parts.local_rank = local_rank;
    parts.local_size = local_size;
    parts.lanes = lanes;
    plane.reset(new HierarchicalGpuDataPlane(std::move(parts)));
    plane->Bind(executor->context());
  }
  Status Allreduce(std::vector<char>* buf, DataType dtype, ReduceOp op) {
    const int64_t count = static_cast<int64_t>(buf->size()) / DataTypeSize(dtype);
    return AllreduceToEnd(*executor, *plane, {{buf->data(), buf->data(), count}}, dtype, op,
                          ranks);
  }
};

std::vector<float> FloatsAt(const std::vector<char>& b, int from, int n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), b.data() + from * 4, n * 4);
  return v;
}

void TestHierarchicalGpu() {
  {  // 2 hosts x 2 ranks, local rank 1: share 1 (elements 2..3) is reduced within
     // the host (x2), copied to the host, across the lane (x2) and back.
    HierarchicalRig rig(2, 1, 2, 2);
    std::vector<char> buf = Floats({1, 2, 3, 4});
    CHECK(rig.Allreduce(&buf, DataType::FLOAT32, ReduceOp::SUM).ok());
    CHECK(FloatsAt(buf, 2, 2) == std::vector<float>({12, 16}));
    CHECK(rig.lane->counts == std::vector<int64_t>({2}));
    CHECK(rig.api.Logged("ReduceScatter 2") && rig.api.Logged("AllGather 8"));
    CHECK(rig.api.Count("Memcpy 8") == 2);  // to the host and back
    CHECK(std::string(rig.plane->last_used()) == "NCCL_HIERARCHICAL");
    // An average is summed here and divided by all 4 ranks in the executor.
    buf = Floats({1, 2, 3, 4});
    CHECK(rig.Allreduce(&buf, DataType::FLOAT32, ReduceOp::AVERAGE).ok());
    CHECK(FloatsAt(buf, 2, 2) == std::vector<float>({3, 4}));
    // The wait for the within-host stage polls until the copy is done.
    rig.api.event_states = {EventState::kPending, EventState::kPending};
    buf = Floats({1, 2, 3, 4});
    CHECK(rig.Allreduce(&buf, DataType::FLOAT32, ReduceOp::MAX).ok());
    CHECK(FloatsAt(buf, 2, 2) == std::vector<float>({3, 4}));
    CHECK(rig.api.event_states.empty());
  }
  {  // Uneven shares (5 elements, 2 lanes: 3 + 2) go through NCCL's grouped forms.
    HierarchicalRig rig(3, 1, 2, 2);
    std::vector<char> buf = Floats({1, 2, 3, 4, 5});
    CHECK(rig.Allreduce(&buf, DataType::FLOAT32, ReduceOp::SUM).ok());
    CHECK(FloatsAt(buf, 3, 2) == std::vector<float>({24, 30}));  // x2 in the host, x3 across
    CHECK(rig.lane->counts == std::vector<int64_t>({2}));
  }
  {  // A rank beyond the lanes (hosts of 3 and 2 ranks: 2 lanes) takes no share:
     // no copy to the host, no cross-host stage, but the within-host stages.
    HierarchicalRig rig(2, 2, 3, 2);
    std::vector<char> buf = Floats({1, 2, 3, 4});
    CHECK(rig.Allreduce(&buf, DataType::FLOAT32, ReduceOp::SUM).ok());
    CHECK(rig.lane == nullptr && rig.api.Count("Memcpy") == 0);
    CHECK(rig.api.Count("Reduce count") == 2 && rig.api.Count("Recv") == 2);
  }
  {  // A peer that fails while the stage within the host runs: the wait for it
     // ends with NCCL's error, and nothing crosses hosts.
    HierarchicalRig rig(2, 0, 2, 2);
    std::vector<char> buf = Floats({1, 2, 3, 4});
    CHECK(rig.Allreduce(&buf, DataType::FLOAT32, ReduceOp::SUM).ok());  // forms the communicators
    rig.lane->counts.clear();
    rig.api.event_states = {EventState::kPending};
    rig.api.async_results = {NcclResult::kRemoteError};
    Status s = rig.Allreduce(&buf, DataType::FLOAT32, ReduceOp::SUM);
    CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "ncclRemoteError"));
    CHECK(Contains(s.message(), "within the host"));
    CHECK(rig.lane->counts.empty());
  }
  {  // Other collectives and ops: NCCL over the whole set, or a clear refusal.
    HierarchicalRig rig(2, 0, 2, 2);
    std::vector<char> in = Floats({1, 2}), out(32);
    Status s = rig.plane->Allgather(in.data(), out.data(), {8, 8, 8, 8});
    CHECK(s.in_progress() && rig.api.Logged("AllGather 8"));
    CHECK(rig.api.Logged("CommInitRank 0/4 dev 0"));  // the whole set's communicator
    CHECK(std::string(rig.plane->last_used()) == "NCCL");
    s = rig.plane->Allreduce(in.data(), in.data(), 2, DataType::FLOAT32, ReduceOp::ADASUM);
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "hierarchical"));
  }
}

}  // namespace

int main() {
  TestHierarchicalGpu();
  return CheckExitCode();
}
