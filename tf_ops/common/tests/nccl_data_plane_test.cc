// Unit tests of the NCCL data plane's logic (ops/nccl_data_plane.*) over a
// fake NCCL/CUDA on host memory (fake_nccl.h): allreduce through the
// executor's pipeline (scaling and averaging as on the CPU, fusion offsets,
// refused ops, NCCL's errors), the call schedules of the ragged
// collectives, and polling a collective to its end (events, CUDA and async
// NCCL errors, the abort flag). Built and run by
// tests/common/test_nccl_cpp.py (ASan/UBSan) and by Bazel as
// //tf_ops:nccl_data_plane_test.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../ops/nccl_communicators.h"
#include "../ops/nccl_data_plane.h"
#include "check.h"
#include "fake_gpu_stack.h"
#include "fake_nccl.h"

using namespace tfring;
using namespace tfring::test;

namespace {

void TestAllreduce() {
  GpuRig rig(3);  // 3 ranks, all holding the same data
  FakeApi& api = rig.api;
  {  // float32 average with pre/postscale, out of place: ((x*2)*3)*0.5/3.
    std::vector<char> in = Floats({1, 2, -4}), out(12);
    CHECK(rig.Allreduce({{in.data(), out.data(), 3}}, DataType::FLOAT32, ReduceOp::AVERAGE, 2.0,
                        0.5).ok());
    CHECK(out == Floats({1, 2, -4}));
    CHECK(in == Floats({1, 2, -4}));
    // Prescale needs the input in the output first; NCCL then sums in place there.
    CHECK(api.Logged("Scale 2.000000") && api.Logged("AllReduce Sum inplace"));
    CHECK(api.Logged("EventRecord"));  // the executor's fence
  }
  {  // float32 average without a postscale: divided by the ranks, as on the CPU
     // (x * (1/3) would round differently).
    std::vector<char> buf = Floats({1, 2, -4});
    api.log.clear();
    CHECK(rig.Allreduce({{buf.data(), buf.data(), 3}}, DataType::FLOAT32, ReduceOp::AVERAGE).ok());
    CHECK(buf == Floats({1, 2, -4}));
    CHECK(api.Logged("Divide 3") && api.Count("Scale") == 0);
  }
  {  // int32 average: summed, then divided with truncation (7*3/3 = 7, -5*3/3 = -5).
    std::vector<char> buf = Ints({7, -5, 1});
    api.log.clear();
    CHECK(rig.Allreduce({{buf.data(), buf.data(), 3}}, DataType::INT32, ReduceOp::AVERAGE).ok());
    CHECK(buf == Ints({7, -5, 1}));
    CHECK(api.Logged("Divide 3") && api.Count("Scale") == 0);
    // int32 sum with postscale 0.5: (x*3)*0.5 truncated.
    buf = Ints({7, -5, 1});
    CHECK(rig.Allreduce({{buf.data(), buf.data(), 3}}, DataType::INT32, ReduceOp::SUM, 1.0, 0.5)
              .ok());
    CHECK(buf == Ints({10, -7, 1}));
    buf = Ints({2, -3, 1});
    CHECK(rig.Allreduce({{buf.data(), buf.data(), 3}}, DataType::INT32, ReduceOp::PRODUCT).ok());
    CHECK(buf == Ints({8, -27, 1}));
    CHECK(api.Logged("AllReduce Product inplace"));
  }
  {  // NCCL cannot reduce bool, and Adasum and Average are no NCCL ops: refused before NCCL.
    api.log.clear();
    std::vector<char> b(4);
    Status s = rig.plane->Allreduce(b.data(), b.data(), 4, DataType::BOOL, ReduceOp::SUM);
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "bool"));
    s = rig.plane->Allreduce(b.data(), b.data(), 1, DataType::FLOAT32, ReduceOp::ADASUM);
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "Adasum"));
    s = rig.plane->Allreduce(b.data(), b.data(), 1, DataType::FLOAT32, ReduceOp::AVERAGE);
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT);
    CHECK(api.Count("AllReduce") == 0);
  }
  {  // A collective that NCCL fails with a remote error aborts the communicators.
    api.collective_result = NcclResult::kRemoteError;
    std::vector<char> b = Floats({1});
    Status s = rig.Allreduce({{b.data(), b.data(), 1}}, DataType::FLOAT32, ReduceOp::SUM);
    CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "ncclAllReduce"));
    CHECK(rig.comms.size() == 0 && api.Count("CommAbort") == 1);
    api.collective_result = NcclResult::kSuccess;
  }
  {  // An enqueue that NCCL reports in progress is waited for.
    api.collective_result = NcclResult::kInProgress;
    api.async_results = {NcclResult::kInProgress, NcclResult::kSuccess};
    std::vector<char> b = Floats({1});
    CHECK(rig.Allreduce({{b.data(), b.data(), 1}}, DataType::FLOAT32, ReduceOp::SUM).ok());
    CHECK(rig.plane->in_progress_waits() == 1);
    api.collective_result = NcclResult::kSuccess;
  }
}

void TestFusedAllreduce() {
  GpuRig rig(2);
  FakeApi& api = rig.api;
  std::vector<char> a = Floats({1, 2}), b = Floats({3}), c = Floats({4, 5, 6});
  std::vector<char> oa(8), ob(4), oc(12);
  std::vector<ReduceSlot> t(4);
  t[0] = {a.data(), oa.data(), 2};
  t[1] = {b.data(), ob.data(), 1};
  t[2] = {nullptr, nullptr, 5};  // joined: zeros, no output
  t[3] = {c.data(), oc.data(), 3};
  CHECK(rig.Allreduce(t, DataType::FLOAT32, ReduceOp::SUM).ok());
  CHECK(oa == Floats({2, 4}) && ob == Floats({6}) && oc == Floats({8, 10, 12}));
  CHECK(api.Logged("Malloc 256"));  // the fusion buffer, rounded up
  // One copy kernel packs the three tensors and one unpacks them.
  CHECK(api.Count("CopyBatch 3") == 2 && api.Count("Memcpy") == 0 && api.Count("Memset") == 1);
  CHECK(api.Count("AllReduce Sum inplace") == 1);
  // Smaller next time: the buffer is reused; bigger: it grows. (A prescale
  // keeps these in the fusion buffer rather than in an NCCL group.)
  std::vector<ReduceSlot> small(t.begin(), t.begin() + 2);
  CHECK(rig.Allreduce(small, DataType::FLOAT32, ReduceOp::SUM, 2.0).ok());
  CHECK(api.Count("Malloc") == 1);
  std::vector<char> big(400 * 4), obig(400 * 4);
  CHECK(rig.Allreduce({{big.data(), obig.data(), 400}, {a.data(), oa.data(), 2}},
                      DataType::FLOAT32, ReduceOp::SUM, 2.0).ok());
  CHECK(api.Count("Malloc") == 2 && api.Count("Free") == 1);
  // One tensor skips the fusion buffer: reduced from its input into its output.
  api.log.clear();
  CHECK(rig.Allreduce({{a.data(), oa.data(), 2}}, DataType::FLOAT32, ReduceOp::SUM).ok());
  CHECK(api.Logged("AllReduce Sum outofplace") && api.Count("Memcpy") == 0);
  CHECK(oa == Floats({2, 4}));
}

void TestRaggedCollectives() {
  FakeBroadcast bc;
  bc.rank = 1;
  FakeApi api;
  NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
  NcclDataPlane plane(&comms, 0, 1, 3, bc.fn());  // rank 1 of 3
  GpuCompletion done;
  {  // Ragged allgather: own block copied, one send per peer, receives at offsets.
    std::vector<char> send(8, 'x'), recv(12, 0);
    CHECK(plane.Allgather(0, nullptr, send.data(), recv.data(), {4, 8, 0}, &done).ok());
    CHECK(std::string(recv.begin(), recv.end()) ==
          std::string(4, '\1') + std::string(8, 'x'));
    CHECK(api.Logged("Send 8 to 0") && api.Logged("Send 8 to 2"));
    CHECK(api.Logged("Recv 4 from 0") && api.Count("Recv") == 1);
    CHECK(api.Count("GroupStart") == 1 && api.Count("GroupEnd") == 1);
    CHECK(api.Count("AllGather") == 0);
    // Equal blocks use NCCL's allgather.
    std::vector<char> out(24);
    CHECK(plane.Allgather(0, nullptr, send.data(), out.data(), {8, 8, 8}, &done).ok());
    CHECK(api.Logged("AllGather 8"));
    CHECK(std::string(out.begin() + 8, out.begin() + 16) == std::string(8, 'x'));
    Status s = plane.Allgather(0, nullptr, send.data(), out.data(), {8, 8}, &done);
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "3 ranks"));
  }
  {  // Alltoall: blocks at their offsets, nothing sent or received when empty.
    api.log.clear();
    std::vector<char> send = {'a', 'b', 'b', 'c'}, recv(5, 0);
    // to rank 0: "a", to self: "bb", to rank 2: "c"; from 0: 1 byte, self 2, from 2: 2.
    CHECK(plane.Alltoall(0, nullptr, send.data(), {1, 2, 1}, recv.data(), {1, 2, 2}, &done).ok());
    CHECK(std::string(recv.begin(), recv.end()) == std::string("\1bb\3\3", 5));
    CHECK(api.Logged("Send 1 to 0") && api.Logged("Send 1 to 2"));
    CHECK(api.Logged("Recv 1 from 0") && api.Logged("Recv 2 from 2"));
    api.log.clear();
    CHECK(plane.Alltoall(0, nullptr, send.data(), {0, 2, 0}, recv.data(), {0, 2, 0}, &done).ok());
    CHECK(api.Count("Send") == 0 && api.Count("Recv") == 0);
    Status s = plane.Alltoall(0, nullptr, send.data(), {1, 2, 1}, recv.data(), {1, 3, 1}, &done);
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "itself"));
  }
  {  // Ragged reducescatter: one reduce per block, rooted at its keeper.
    api.log.clear();
    std::vector<char> send = Floats({1, 2, 3, 4, 5, 6, 7}), recv(8);
    CHECK(plane.Reducescatter(0, nullptr, send.data(), recv.data(), {3, 2, 2}, DataType::FLOAT32,
                              ReduceOp::SUM, &done)
              .ok());
    CHECK(api.Logged("Reduce count 3 root 0") && api.Logged("Reduce count 2 root 1") &&
          api.Logged("Reduce count 2 root 2"));
    CHECK(recv == Floats({12, 15}));  // rank 1's block, summed over 3 equal ranks
    CHECK(api.Count("ReduceScatter") == 0);
    // Equal blocks: NCCL's reducescatter.
    std::vector<char> six = Floats({1, 2, 3, 4, 5, 6}), out(8);
    CHECK(plane.Reducescatter(0, nullptr, six.data(), out.data(), {2, 2, 2}, DataType::FLOAT32,
                              ReduceOp::SUM, &done)
              .ok());
    CHECK(api.Logged("ReduceScatter 2"));
    CHECK(out == Floats({9, 12}));  // (3,4) * 3 ranks
    CHECK(six == Floats({1, 2, 3, 4, 5, 6}));
    // Average is the executor's: the plane refuses it.
    Status s = plane.Reducescatter(0, nullptr, six.data(), out.data(), {2, 2, 2},
                                   DataType::FLOAT32, ReduceOp::AVERAGE, &done);
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT);
  }
  {  // Broadcast checks its root.
    std::vector<char> b(4);
    Status s = plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 3, &done);
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "root 3"));
    CHECK(plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 2, &done).ok());
    CHECK(api.Logged("Broadcast 4 root 2"));
  }
}

void TestPolling() {
  FakeBroadcast bc;
  FakeApi api;
  auto abort = std::make_shared<NcclAbortFlag>();
  NcclCommunicators comms(&api, abort);
  NcclDataPlane plane(&comms, 0, 0, 2, bc.fn());
  std::vector<char> b = Floats({1});
  GpuCompletion done;
  CHECK(plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 0, &done).ok());
  api.event_states = {EventState::kPending, EventState::kPending};
  CHECK(plane.Poll(&done).in_progress());
  CHECK(plane.Poll(&done).in_progress());
  CHECK(plane.Poll(&done).ok() && !done.pending());
  CHECK(plane.Poll(&done).ok());  // nothing pending
  // Completion events are reused.
  CHECK(plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 0, &done).ok());
  CHECK(plane.Poll(&done).ok());
  CHECK(api.events_created == 1);
  {  // Two in flight need two events; a moved completion stays valid.
    GpuCompletion x, y;
    CHECK(plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 0, &x).ok());
    CHECK(plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 0, &y).ok());
    GpuCompletion z(std::move(x));
    CHECK(!x.pending() && z.pending());
    CHECK(api.events_created == 2);
  }
  // A CUDA error while waiting.
  CHECK(plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 0, &done).ok());
  api.event_states = {EventState::kError};
  Status s = plane.Poll(&done);
  CHECK(s.code() == StatusCode::UNKNOWN && Contains(s.message(), "cuda error text 700"));
  // An async NCCL error while the collective runs aborts the communicator.
  CHECK(plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 0, &done).ok());
  api.event_states = {EventState::kPending};
  api.async_results = {NcclResult::kSystemError};
  s = plane.Poll(&done);
  CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "ncclSystemError"));
  CHECK(api.Count("CommAbort") == 1 && comms.size() == 0 && !done.pending());
  // The abort flag ends a pending wait, even when the event looks done.
  CHECK(plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 0, &done).ok());
  abort->Request("rank 1 is gone");
  s = plane.Poll(&done);
  CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "rank 1 is gone"));
  CHECK(comms.size() == 0);
  // ...and no new communicator is formed afterwards.
  s = plane.Broadcast(0, nullptr, b.data(), b.data(), 4, 0, &done);
  CHECK(s.code() == StatusCode::ABORTED);
}

}  // namespace

// Fused tensors of 4 MB or more on average, all this rank's, with no
// prescale, go to NCCL as one group of allreduces, each in its own memory: no
// fusion buffer, no copies.
void TestGroupedAllreduce() {
  GpuRig rig(2);
  FakeApi& api = rig.api;
  const int64_t n = 1 << 20;  // 4 MB of floats
  std::vector<float> x(n, 1.5f), y(n, -2.0f), z(n, 3.0f);
  x[n - 1] = 7;
  std::vector<char> a = Floats(x), b = Floats(y), c = Floats(z);
  const std::vector<char> a0 = a;
  std::vector<char> oa(a.size()), ob(b.size());
  CHECK(rig.Allreduce({{a.data(), oa.data(), n}, {b.data(), ob.data(), n}, {c.data(), c.data(), n}},
                      DataType::FLOAT32, ReduceOp::SUM).ok());
  for (float& v : x) v *= 2;
  for (float& v : y) v *= 2;
  for (float& v : z) v *= 2;
  CHECK(oa == Floats(x) && ob == Floats(y) && c == Floats(z) && a == a0);  // input untouched
  CHECK(api.Count("AllReduce Sum outofplace") == 2 && api.Count("AllReduce Sum inplace") == 1);
  CHECK(api.Count("Malloc") == 0 && api.Count("Memcpy") == 0 && api.Count("GroupStart") == 1 &&
        api.Count("GroupEnd") == 1 && api.Count("AllReduce") == 3);
  // Average over 2 ranks divides each output where it lies.
  api.log.clear();
  CHECK(rig.Allreduce({{a.data(), oa.data(), n}, {b.data(), ob.data(), n}}, DataType::FLOAT32,
                      ReduceOp::AVERAGE).ok());
  CHECK(oa == a && ob == b);
  CHECK(api.Count("Divide 2") == 2 && api.Count("CopyBatch") == 0 && api.Count("GroupStart") == 1);
  // Smaller tensors are packed instead: two copy kernels beat a launch each.
  api.log.clear();
  CHECK(rig.Allreduce({{a.data(), oa.data(), n}, {b.data(), ob.data(), 1000}}, DataType::FLOAT32,
                      ReduceOp::SUM).ok());
  CHECK(api.Count("GroupStart") == 0 && api.Count("CopyBatch 2") == 2);
  // A call NCCL refuses inside the group: the error comes back, the group is closed.
  api.log.clear();
  api.collective_result = NcclResult::kInvalidArgument;
  Status s = rig.Allreduce({{a.data(), oa.data(), n}, {b.data(), ob.data(), n}},
                           DataType::FLOAT32, ReduceOp::SUM);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "grouped"));
  CHECK(api.Count("GroupEnd") == 1 && api.Count("AllReduce") == 1);
  api.collective_result = NcclResult::kSuccess;
}

int main() {
  TestAllreduce();
  TestFusedAllreduce();
  TestGroupedAllreduce();
  TestRaggedCollectives();
  TestPolling();
  return CheckExitCode();
}
