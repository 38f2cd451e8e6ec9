// Unit tests of the NCCL communicators' logic (ops/nccl_communicators.*)
// over a fake NCCL on host memory (fake_nccl.h): NCCL and CUDA result codes
// as Status, communicators keyed by process set and device, the unique-id
// exchange, and waiting on non-blocking communicators (async errors, the
// abort flag, the timeout). Built and run by tests/common/test_nccl_cpp.py
// (ASan/UBSan) and by Bazel as //tf_ops:nccl_communicators_test.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../ops/nccl_api.h"
#include "../ops/nccl_communicators.h"
#include "check.h"
#include "fake_nccl.h"

using namespace tfring;
using namespace tfring::test;

namespace {

void TestResultMapping() {
  struct Case {
    NcclResult r;
    StatusCode code;
  } cases[] = {
      {NcclResult::kUnhandledCudaError, StatusCode::UNKNOWN},
      {NcclResult::kSystemError, StatusCode::ABORTED},
      {NcclResult::kInternalError, StatusCode::UNKNOWN},
      {NcclResult::kInvalidArgument, StatusCode::INVALID_ARGUMENT},
      {NcclResult::kInvalidUsage, StatusCode::INVALID_ARGUMENT},
      {NcclResult::kRemoteError, StatusCode::ABORTED},
      {NcclResult::kTimeout, StatusCode::ABORTED},
  };
  for (const Case& c : cases) {
    Status s = NcclResultToStatus(c.r, "ncclAllReduce", "the error string", "the last error");
    CHECK(s.code() == c.code);
    CHECK(Contains(s.message(), "ncclAllReduce"));
    CHECK(Contains(s.message(), NcclResultName(c.r)));
    CHECK(Contains(s.message(), "(" + std::to_string(static_cast<int>(c.r)) + ")"));
    CHECK(Contains(s.message(), "the error string"));
    CHECK(Contains(s.message(), "the last error"));
  }
  CHECK(NcclResultToStatus(NcclResult::kSuccess, "x", "", "").ok());
  CHECK(NcclResultToStatus(NcclResult::kInProgress, "x", "", "").in_progress());
  // NCCL's last error is often its error string again: not said twice.
  Status same = NcclResultToStatus(NcclResult::kInternalError, "x", "same", "same");
  CHECK(same.message().find("same") == same.message().rfind("same"));
  CHECK(std::string(NcclResultName(NcclResult::kRemoteError)) == "ncclRemoteError");

  Status cuda = CudaErrorToStatus(2, "cudaMalloc", "out of memory");
  CHECK(cuda.code() == StatusCode::UNKNOWN);
  CHECK(Contains(cuda.message(), "cudaMalloc") && Contains(cuda.message(), "out of memory"));
  CHECK(CudaErrorToStatus(0, "x", "").ok());
}

void TestKeying() {
  FakeApi api;
  auto abort = std::make_shared<NcclAbortFlag>();
  FakeBroadcast bc;
  {
    NcclCommunicators comms(&api, abort);
    NcclComm a = nullptr, b = nullptr, c = nullptr, d = nullptr;
    CHECK(comms.Get(0, 0, 0, 2, bc.fn(), &a).ok());
    CHECK(comms.Get(0, 0, 0, 2, bc.fn(), &b).ok());
    CHECK(a != nullptr && a == b);
    CHECK(api.Count("CommInitRank") == 1 && api.Count("GetUniqueId") == 1);
    // Another device of the same set, and another set: new communicators,
    // each formed on its own device.
    CHECK(comms.Get(0, 1, 0, 2, bc.fn(), &c).ok());
    CHECK(api.Logged("CommInitRank 0/2 dev 1"));
    CHECK(comms.Get(3, 0, 0, 2, bc.fn(), &d).ok());
    CHECK(c != a && d != a && d != c);
    CHECK(comms.size() == 3);
    CHECK(api.Count("CommInitRank") == 3);
    // The same key asked for another rank/size is a caller bug, said so.
    NcclComm e = nullptr;
    Status s = comms.Get(0, 0, 1, 3, bc.fn(), &e);
    CHECK(s.code() == StatusCode::UNKNOWN);
    CHECK(Contains(s.message(), "process set 0") && Contains(s.message(), "rank 0 of 2"));
    // Removing a set destroys its communicators on every device; its id can
    // then be reused with another membership.
    comms.Remove(0);
    CHECK(api.Count("CommDestroy") == 2);
    CHECK(api.C(a)->destroyed && api.C(c)->destroyed && !api.C(d)->destroyed);
    CHECK(comms.size() == 1);
    FakeBroadcast as_rank1;
    as_rank1.rank = 1;
    CHECK(comms.Get(0, 0, 1, 3, as_rank1.fn(), &e).ok());
    CHECK(e != a);
  }
  // Destroyed with the cache (no abort requested): destroyed, not aborted.
  CHECK(api.Count("CommDestroy") == 4);
  CHECK(api.Count("CommAbort") == 0);
}

void TestIdExchange() {
  {  // Rank 0 makes the id and sends it; it forms its communicator with it.
    FakeApi api;
    api.next_id = std::string(kNcclUniqueIdBytes, 'z');
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
    FakeBroadcast bc;
    NcclComm c = nullptr;
    CHECK(comms.Get(5, 0, 0, 4, bc.fn(), &c).ok());
    CHECK(bc.sent.size() == 1 && bc.sent[0] == api.next_id);
    CHECK(api.C(c)->id == api.next_id && api.C(c)->rank == 0 && api.C(c)->nranks == 4);
  }
  {  // Another rank takes the id it receives and makes none.
    FakeApi api;
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
    FakeBroadcast bc;
    bc.rank = 2;
    NcclComm c = nullptr;
    CHECK(comms.Get(5, 0, 2, 4, bc.fn(), &c).ok());
    CHECK(api.Count("GetUniqueId") == 0);
    CHECK(api.C(c)->id == bc.from_root && api.C(c)->rank == 2);
  }
  {  // A truncated id is refused before NCCL sees it.
    FakeApi api;
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
    FakeBroadcast bc;
    bc.rank = 1;
    bc.from_root = "short";
    NcclComm c = nullptr;
    Status s = comms.Get(5, 0, 1, 2, bc.fn(), &c);
    CHECK(!s.ok() && Contains(s.message(), "5 bytes") && Contains(s.message(), "128"));
    CHECK(api.Count("CommInitRank") == 0 && comms.size() == 0);
  }
  {  // Rank 0 cannot make an id: it still broadcasts (empty), so no rank waits forever.
    FakeApi api;
    api.id_result = NcclResult::kSystemError;
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
    FakeBroadcast bc;
    NcclComm c = nullptr;
    Status s = comms.Get(5, 0, 0, 2, bc.fn(), &c);
    CHECK(s.code() == StatusCode::ABORTED);
    CHECK(Contains(s.message(), "ncclGetUniqueId") && Contains(s.message(), "ncclSystemError"));
    CHECK(bc.sent.size() == 1 && bc.sent[0].empty());
    CHECK(api.Count("CommInitRank") == 0);
  }
  {  // ...and the others learn that rank 0 failed.
    FakeApi api;
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
    FakeBroadcast bc;
    bc.rank = 1;
    bc.from_root = "";
    NcclComm c = nullptr;
    Status s = comms.Get(5, 0, 1, 2, bc.fn(), &c);
    CHECK(!s.ok() && Contains(s.message(), "rank 0 of the process set could not create"));
  }
  {  // The controller's failure comes up with its cause.
    FakeApi api;
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
    FakeBroadcast bc;
    bc.result = Status::Aborted("rank 1 died");
    NcclComm c = nullptr;
    Status s = comms.Get(5, 0, 0, 2, bc.fn(), &c);
    CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "rank 1 died"));
    CHECK(Contains(s.message(), "process set 5"));
  }
}

void TestNonBlockingInit() {
  FakeBroadcast bc;
  {  // Forming: polled until ready, even when the init call said success.
    FakeApi api;
    api.async_results = {NcclResult::kInProgress, NcclResult::kInProgress,
                         NcclResult::kInProgress};
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
    NcclComm c = nullptr;
    CHECK(comms.Get(1, 0, 0, 2, bc.fn(), &c).ok());
    CHECK(api.async_queries == 4);
  }
  {  // An async error while forming: the communicator is aborted, not kept.
    FakeApi api;
    api.init_result = NcclResult::kInProgress;
    api.async_results = {NcclResult::kInProgress, NcclResult::kRemoteError};
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
    NcclComm c = nullptr;
    Status s = comms.Get(1, 0, 0, 2, bc.fn(), &c);
    CHECK(s.code() == StatusCode::ABORTED);
    CHECK(Contains(s.message(), "ncclRemoteError") && Contains(s.message(), "last error detail"));
    CHECK(api.Count("CommAbort") == 1 && comms.size() == 0);
  }
  {  // The abort flag ends the wait (a dead peer would otherwise hang it).
    FakeApi api;
    api.async_forever_in_progress = true;
    auto abort = std::make_shared<NcclAbortFlag>();
    abort->Request("rank 3 died");
    abort->Request("a later reason is not kept");
    NcclCommunicators comms(&api, abort);
    NcclComm c = nullptr;
    Status s = comms.Get(1, 0, 0, 2, bc.fn(), &c);
    CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "rank 3 died"));
    CHECK(!Contains(s.message(), "later"));
  }
  {
    FakeApi api;
    api.async_forever_in_progress = true;
    auto abort = std::make_shared<NcclAbortFlag>();
    NcclCommunicators comms(&api, abort);
    NcclComm first = nullptr;
    api.async_forever_in_progress = false;
    CHECK(comms.Get(1, 0, 0, 2, bc.fn(), &first).ok());
    api.async_forever_in_progress = true;
    abort->Request("peer gone");
    NcclComm c = nullptr;
    Status s = comms.Get(2, 0, 0, 2, bc.fn(), &c);
    CHECK(s.code() == StatusCode::ABORTED);
    // Every cached communicator is aborted too.
    CHECK(api.C(first)->aborted && comms.size() == 0);
  }
  {  // And the deadline.
    FakeApi api;
    api.async_forever_in_progress = true;
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>(),
                            std::chrono::milliseconds(50));
    NcclComm c = nullptr;
    Status s = comms.Get(1, 0, 0, 2, bc.fn(), &c);
    CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "did not finish"));
    CHECK(api.Count("CommAbort") == 1 && comms.size() == 0);
  }
  {  // A synchronous init failure.
    FakeApi api;
    api.init_result = NcclResult::kInvalidUsage;
    NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
    NcclComm c = nullptr;
    Status s = comms.Get(1, 0, 0, 2, bc.fn(), &c);
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT);
    CHECK(Contains(s.message(), "ncclCommInitRankConfig") && Contains(s.message(), "GPU 0"));
    CHECK(comms.size() == 0);
  }
}

}  // namespace

int main() {
  TestResultMapping();
  TestKeying();
  TestIdExchange();
  TestNonBlockingInit();
  return CheckExitCode();
}
