// Unit tests of the NCCL data plane's logic with a fake NcclApi on host
// memory: no GPU, no nccl.h, no CUDA. Communicator keying, the unique-id
// exchange, waiting on non-blocking communicators (async errors, the abort
// flag, the timeout), NCCL result codes as Status, the call schedules of the
// ragged collectives, fusion offsets, and scaling/averaging semantics.
// Built and run by tests/common/test_nccl_cpp.py (ASan/UBSan) and by Bazel
// as //tf_ops:nccl_plane_test.
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "../executor.h"
#include "../ops/gpu_executor.h"
#include "../ops/nccl_api.h"
#include "../ops/hierarchical_gpu_data_plane.h"
#include "../ops/nccl_data_plane.h"
#include "../reduction.h"

#include "check.h"

using namespace tfring;


namespace {

// A fake NCCL + CUDA on host memory. A communicator of `size` ranks acts as
// if every peer held the same data as this rank, so reductions have known
// results (SUM = size * x); point-to-point receives fill their block with
// the byte (peer + 1), so the test can see where each block landed.
class FakeApi : public NcclApi {
 public:
  struct Comm {
    int nranks, rank;
    std::string id;
    bool aborted = false, destroyed = false;
  };

  std::vector<std::string> log;
  std::string next_id = std::string(kNcclUniqueIdBytes, 'u');
  NcclResult id_result = NcclResult::kSuccess;
  NcclResult init_result = NcclResult::kSuccess;
  NcclResult collective_result = NcclResult::kSuccess;
  std::deque<NcclResult> async_results;  // then kSuccess (or `async_forever`)
  bool async_forever_in_progress = false;
  std::deque<EventState> event_states;   // then kDone
  int current_device = 0;
  int events_created = 0;
  int async_queries = 0;
  std::vector<Comm*> comms;
  std::map<void*, int64_t> allocations;

  ~FakeApi() override {
    for (Comm* c : comms) delete c;
  }
  Comm* C(NcclComm c) { return static_cast<Comm*>(c); }
  void Log(const std::string& s) { log.push_back(s); }
  bool Logged(const std::string& s) const {
    for (const auto& l : log)
      if (l == s) return true;
    return false;
  }
  int Count(const std::string& prefix) const {
    int n = 0;
    for (const auto& l : log) n += l.compare(0, prefix.size(), prefix) == 0;
    return n;
  }

  NcclResult GetUniqueId(std::string* id) override {
    Log("GetUniqueId");
    if (id_result == NcclResult::kSuccess) *id = next_id;
    return id_result;
  }
  NcclResult CommInitRank(NcclComm* comm, int nranks, const std::string& id, int rank) override {
    Log("CommInitRank " + std::to_string(rank) + "/" + std::to_string(nranks) + " dev " +
        std::to_string(current_device));
    Comm* c = new Comm{nranks, rank, id};
    comms.push_back(c);
    *comm = c;
    return init_result;
  }
  NcclResult CommGetAsyncError(NcclComm, NcclResult* async) override {
    ++async_queries;
    if (!async_results.empty()) {
      *async = async_results.front();
      async_results.pop_front();
    } else {
      *async = async_forever_in_progress ? NcclResult::kInProgress : NcclResult::kSuccess;
    }
    return NcclResult::kSuccess;
  }
  NcclResult CommAbort(NcclComm comm) override {
    Log("CommAbort");
    C(comm)->aborted = true;
    return NcclResult::kSuccess;
  }
  NcclResult CommDestroy(NcclComm comm) override {
    Log("CommDestroy");
    C(comm)->destroyed = true;
    return NcclResult::kSuccess;
  }
  std::string ErrorString(NcclResult r) override {
    return std::string("text of ") + NcclResultName(r);
  }
  std::string LastError(NcclComm) override { return "last error detail"; }
  NcclResult GroupStart() override {
    Log("GroupStart");
    return NcclResult::kSuccess;
  }
  NcclResult GroupEnd() override {
    Log("GroupEnd");
    return NcclResult::kSuccess;
  }

  // recv = op over `n` copies of send.
  void ReduceCopies(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                    int n) {
    const int64_t bytes = count * DataTypeSize(dtype);
    std::vector<char> orig(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
    std::memcpy(recv, orig.data(), bytes);
    for (int i = 1; i < n; ++i) ReduceInto(recv, orig.data(), count, dtype, op);
  }
  NcclResult AllReduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                       NcclComm comm, GpuStream) override {
    Log(std::string("AllReduce ") + ReduceOpName(op) + (send == recv ? " inplace" : " outofplace"));
    if (collective_result != NcclResult::kSuccess) return collective_result;
    ReduceCopies(send, recv, count, dtype, op, C(comm)->nranks);
    return NcclResult::kSuccess;
  }
  NcclResult Reduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                    int root, NcclComm comm, GpuStream) override {
    Log("Reduce count " + std::to_string(count) + " root " + std::to_string(root));
    if (root == C(comm)->rank) ReduceCopies(send, recv, count, dtype, op, C(comm)->nranks);
    return NcclResult::kSuccess;
  }
  NcclResult ReduceScatter(const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp op, NcclComm comm, GpuStream) override {
    Log("ReduceScatter " + std::to_string(count));
    ReduceCopies(static_cast<const char*>(send) + C(comm)->rank * count * DataTypeSize(dtype),
                 recv, count, dtype, op, C(comm)->nranks);
    return NcclResult::kSuccess;
  }
  NcclResult AllGather(const void* send, void* recv, int64_t bytes, NcclComm comm,
                       GpuStream) override {
    Log("AllGather " + std::to_string(bytes));
    for (int r = 0; r < C(comm)->nranks; ++r) {
      char* block = static_cast<char*>(recv) + r * bytes;
      if (r == C(comm)->rank) {
        std::memcpy(block, send, bytes);
      } else {
        std::memset(block, r + 1, bytes);
      }
    }
    return NcclResult::kSuccess;
  }
  NcclResult Broadcast(const void*, void*, int64_t bytes, int root, NcclComm,
                       GpuStream) override {
    Log("Broadcast " + std::to_string(bytes) + " root " + std::to_string(root));
    return collective_result;
  }
  NcclResult Send(const void*, int64_t bytes, int peer, NcclComm, GpuStream) override {
    Log("Send " + std::to_string(bytes) + " to " + std::to_string(peer));
    return NcclResult::kSuccess;
  }
  NcclResult Recv(void* buf, int64_t bytes, int peer, NcclComm, GpuStream) override {
    Log("Recv " + std::to_string(bytes) + " from " + std::to_string(peer));
    std::memset(buf, peer + 1, bytes);
    return NcclResult::kSuccess;
  }
  bool SupportsDataType(DataType dtype) const override {
    return dtype != DataType::BOOL && dtype != DataType::INT16 && dtype != DataType::UINT16;
  }

  int GetDevice(int* device) override {
    *device = current_device;
    return 0;
  }
  int SetDevice(int device) override {
    current_device = device;
    return 0;
  }
  int Malloc(void** ptr, int64_t bytes) override {
    Log("Malloc " + std::to_string(bytes));
    *ptr = ::operator new(static_cast<size_t>(bytes));
    allocations[*ptr] = bytes;
    return 0;
  }
  int Free(void* ptr) override {
    Log("Free");
    allocations.erase(ptr);
    ::operator delete(ptr);
    return 0;
  }
  int MemcpyAsync(void* dst, const void* src, int64_t bytes, GpuStream) override {
    Log("Memcpy " + std::to_string(bytes));
    std::memmove(dst, src, bytes);
    return 0;
  }
  int MemsetAsync(void* dst, int value, int64_t bytes, GpuStream) override {
    Log("Memset " + std::to_string(bytes));
    std::memset(dst, value, bytes);
    return 0;
  }
  int EventCreate(GpuEvent* event) override {
    ++events_created;
    *event = reinterpret_cast<GpuEvent>(static_cast<intptr_t>(events_created));
    return 0;
  }
  int EventRecord(GpuEvent, GpuStream) override {
    Log("EventRecord");
    return 0;
  }
  EventState EventQuery(GpuEvent, int* error) override {
    *error = 0;
    if (event_states.empty()) return EventState::kDone;
    EventState s = event_states.front();
    event_states.pop_front();
    if (s == EventState::kError) *error = 700;
    return s;
  }
  int EventDestroy(GpuEvent) override { return 0; }
  std::string CudaErrorString(int error) override {
    return "cuda error text " + std::to_string(error);
  }
  int Scale(void* dst, const void* src, int64_t count, DataType dtype, double factor,
            GpuStream) override {
    Log("Scale " + std::to_string(factor));
    std::memmove(dst, src, count * DataTypeSize(dtype));
    return ScaleBuffer(dst, count, dtype, factor).ok() ? 0 : 1;
  }
  int Divide(void* buf, int64_t count, DataType dtype, int64_t divisor, GpuStream) override {
    Log("Divide " + std::to_string(divisor));
    return FinishReduction(buf, count, dtype, ReduceOp::AVERAGE, 1.0, static_cast<int>(divisor))
                   .ok()
               ? 0
               : 1;
  }
};

// The controller's broadcast from rank 0, seen from one rank.
struct FakeBroadcast {
  std::string from_root = std::string(kNcclUniqueIdBytes, 'r');  // what non-roots receive
  std::vector<std::string> sent;                                   // what this rank passed in
  Status result = Status::OK();
  int rank = 0;
  BroadcastBytesFn fn() {
    return [this](std::string* bytes) {
      sent.push_back(*bytes);
      if (!result.ok()) return result;
      if (rank != 0) *bytes = from_root;
      return Status::OK();
    };
  }
};

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

std::vector<char> Floats(std::initializer_list<float> v) {
  std::vector<char> b(v.size() * 4);
  std::memcpy(b.data(), v.begin(), b.size());
  return b;
}
std::vector<char> Ints(std::initializer_list<int32_t> v) {
  std::vector<char> b(v.size() * 4);
  std::memcpy(b.data(), v.begin(), b.size());
  return b;
}

// Runs an allreduce through the executor's pipeline and polls its fence to
// the end; `ranks` divides an average.
Status AllreduceToEnd(Executor& executor, DataPlane& plane, const std::vector<ReduceSlot>& slots,
                      DataType dtype, ReduceOp op, int ranks, double prescale = 1.0,
                      double postscale = 1.0) {
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
  CHECK(api.Count("Memcpy") == 6 && api.Count("Memset") == 1);
  CHECK(api.Count("AllReduce Sum inplace") == 1);
  // Smaller next time: the buffer is reused; bigger: it grows.
  std::vector<ReduceSlot> small(t.begin(), t.begin() + 2);
  CHECK(rig.Allreduce(small, DataType::FLOAT32, ReduceOp::SUM).ok());
  CHECK(api.Count("Malloc") == 1);
  std::vector<char> big(400 * 4), obig(400 * 4);
  CHECK(rig.Allreduce({{big.data(), obig.data(), 400}, {a.data(), oa.data(), 2}},
                      DataType::FLOAT32, ReduceOp::SUM).ok());
  CHECK(api.Count("Malloc") == 2 && api.Count("Free") == 1);
  // One tensor skips the fusion buffer: reduced from its input into its output.
  api.log.clear();
  CHECK(rig.Allreduce({{a.data(), oa.data(), 2}}, DataType::FLOAT32, ReduceOp::SUM).ok());
  CHECK(api.Logged("AllReduce Sum outofplace") && api.Count("Memcpy") == 0);
  CHECK(oa == Floats({2, 4}));
}

// Host staging: every tensor crosses into page-locked host memory, the
// reduction runs there (here a host plane of one rank: a copy), and the
// result crosses back; the pipeline is the executor's, unchanged.
void TestHostStaging() {
  FakeApi api;
  NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
  GpuShared shared;
  shared.api = &api;
  shared.comms = &comms;
  shared.events = std::make_shared<GpuEventPool>(&api);
  std::unique_ptr<Executor> ex;
  CHECK(HostStagedExecutor::Create(&shared, 0, &ex).ok());
  // A host "plane" of 2 ranks holding the same data: SUM doubles.
  struct Doubling : DataPlane {
    const char* name() const override { return "doubling"; }
    Status Allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp) override {
      std::vector<float> v(count);
      std::memcpy(v.data(), in, count * 4);
      for (auto& x : v) x *= 2;
      std::memcpy(out, v.data(), count * 4);
      (void)dtype;
      return Status::OK();
    }
    Status Allgather(const void*, void*, const std::vector<int64_t>&) override { return {}; }
    Status Broadcast(void*, int64_t, int) override { return {}; }
    Status Alltoall(const void*, const std::vector<int64_t>&, void*,
                    const std::vector<int64_t>&) override { return {}; }
    Status Reducescatter(const void*, void*, const std::vector<int64_t>&, DataType,
                         ReduceOp) override { return {}; }
    Status Barrier() override { return {}; }
  } plane;
  std::vector<char> in = Floats({1, 2, 3}), out(12);
  RunResult run = RunAllreduce(*ex, plane, {{in.data(), out.data(), 3}}, DataType::FLOAT32,
                               ReduceOp::AVERAGE, 1.0, 1.0, 2,
                               [](const std::string&, std::chrono::steady_clock::time_point) {});
  CHECK(run.status.in_progress() && run.pending);  // the copy back is queued
  CHECK(run.pending->Query().ok());
  CHECK(out == Floats({1, 2, 3}));
  // In, then out: even a single tensor is not reduced in its own output.
  CHECK(api.Count("Memcpy") == 2 && shared.staged_copies.load() == 2);
  // A buffer for the plane is never the tensor itself.
  CHECK(ex->PlaneBuffer(out.data(), 1, 12) != out.data());
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

// The GPU executor's primitives and its fence.
void TestExecutorPrimitives() {
  GpuRig rig(2, /*device=*/1);
  FakeApi& api = rig.api;
  Executor& ex = *rig.executor;
  CHECK(ex.FusionBuffer(100) != nullptr && api.current_device == 1);
  std::vector<char> a = Floats({1, 2, 3}), b(12);
  CHECK(ex.Copy(b.data(), a.data(), 12).ok() && b == a);
  CHECK(ex.Scale(b.data(), 3, DataType::FLOAT32, 4.0).ok());
  CHECK(b == Floats({4, 8, 12}));
  // Average over 4 ranks with postscale 2: x * 2 / 4.
  CHECK(ex.FinishReduction(b.data(), 3, DataType::FLOAT32, ReduceOp::AVERAGE, 2.0, 4).ok());
  CHECK(b == Floats({2, 4, 6}));
  std::vector<char> i = Ints({9, -9, 4});
  CHECK(ex.FinishReduction(i.data(), 3, DataType::INT32, ReduceOp::AVERAGE, 1.0, 4).ok());
  CHECK(i == Ints({2, -2, 1}) && api.Logged("Divide 4"));
  CHECK(ex.Zero(b.data(), 12).ok() && b == Floats({0, 0, 0}));
  Status s = ex.Scale(b.data(), 3, DataType::BOOL, 2.0);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT);
  // A fence forms no communicator; it watches the device's once formed.
  std::unique_ptr<DeviceEvent> fence = ex.Fence();
  CHECK(fence != nullptr && api.Count("CommInitRank") == 0);
  api.event_states = {EventState::kPending};
  CHECK(fence->Query().in_progress());
  CHECK(fence->Query().ok());
  std::vector<char> x = Floats({1});
  CHECK(rig.plane->Allreduce(x.data(), x.data(), 1, DataType::FLOAT32, ReduceOp::SUM)
            .in_progress());
  fence = ex.Fence();
  api.event_states = {EventState::kPending};
  api.async_results = {NcclResult::kRemoteError};
  s = fence->Query();
  CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "ncclRemoteError"));
  // The abort flag ends a fence's wait too, communicator or not.
  fence = ex.Fence();
  api.event_states = {EventState::kPending};
  rig.abort->Request("shutting down");
  s = fence->Query();
  CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "shutting down"));
}

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
  TestResultMapping();
  TestKeying();
  TestIdExchange();
  TestNonBlockingInit();
  TestAllreduce();
  TestFusedAllreduce();
  TestHostStaging();
  TestRaggedCollectives();
  TestPolling();
  TestExecutorPrimitives();
  TestHierarchicalGpu();
  return CheckExitCode();
}
