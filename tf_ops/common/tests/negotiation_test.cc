// Unit tests of negotiation in the framework-agnostic core (no TensorFlow,
// no MPI): message serialization, fusion planning, the coordinator's
// validation and ordering, joins and groups, devices in negotiation and
// ready events. Built and run by tests/common/test_core_cpp.py (and by Bazel
// as //tf_ops:negotiation_test).

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../controller.h"
#include "../fusion_buffer.h"
#include "../mapped_buffer.h"
#include "../message.h"
#include "../tensor_queue.h"

#include "check.h"
#include "controller_harness.h"

using namespace tfring;

// A controller with no transport: tests drive Ingest/BuildResponseList directly.
class LocalController : public Controller {
 public:
  LocalController(int size, int64_t threshold = 1 << 20)
      : Controller(0, Ranks(size), MakeConfig(threshold)) {}
  // A process set: set rank i is job-wide rank global_ranks[i].
  explicit LocalController(std::vector<int> global_ranks)
      : Controller(0, std::move(global_ranks), MakeConfig(1 << 20)) {}

 protected:
  Status GatherRequests(const std::string&, std::vector<std::string>*) override {
    return Status::Unknown("not used");
  }
  Status BroadcastResponses(std::string*) override { return Status::Unknown("not used"); }
  Status AllreduceBitsAnd(std::vector<uint64_t>*) override { return Status::Unknown("not used"); }

 private:
  static std::vector<int> Ranks(int n) {
    std::vector<int> r;
    for (int i = 0; i < n; ++i) r.push_back(i);
    return r;
  }
  static Config MakeConfig(int64_t threshold) {
    Config c;
    c.fusion_threshold_bytes = threshold;
    return c;
  }
};

static void Submit(LocalController& c, int rank, std::vector<Request> reqs) {
  RequestList list;
  list.requests = std::move(reqs);
  c.Ingest(list, rank);
}

static void TestSerialization() {
  RequestList in;
  in.shutdown = true;
  in.shutdown_reason = "bye";
  in.shutdown_cause = static_cast<int32_t>(FailureCause::TIMEOUT);
  in.shutdown_rank = 2;
  Request a = Req(1, "grad/a", CollectiveType::ALLTOALL, DataType::BFLOAT16, {3, 5});
  a.splits = {1, 2};
  a.root_rank = 1;
  a.reduce_op = ReduceOp::MAX;
  a.prescale_factor = 0.5;
  a.group_name = "g";
  a.group_size = 2;
  a.group_index = 1;
  in.requests = {a, Req(0, "b")};
  RequestList out;
  CHECK(ParseRequestList(SerializeRequestList(in), &out).ok());
  CHECK(out.shutdown && out.shutdown_reason == "bye");
  CHECK(out.shutdown_cause == in.shutdown_cause && out.shutdown_rank == 2);
  CHECK(out.requests.size() == 2 && out.requests[0] == a && out.requests[1] == in.requests[1]);

  ResponseList rin;
  Response r;
  r.type = ResponseType::ERROR;
  r.tensor_names = {"x", "y"};
  r.error_message = "bad";
  r.tensor_sizes = {1, 2, 3};
  r.int_result = 7;
  r.ranks = {0, 2};
  rin.responses = {r};
  rin.shutdown = true;
  rin.shutdown_cause = static_cast<int32_t>(FailureCause::SHUTDOWN);
  rin.shutdown_rank = 1;
  ResponseList rout;
  CHECK(ParseResponseList(SerializeResponseList(rin), &rout).ok());
  CHECK(rout.responses.size() == 1 && rout.responses[0] == r);
  CHECK(rout.shutdown && rout.shutdown_cause == rin.shutdown_cause && rout.shutdown_rank == 1);

  // Truncated or foreign bytes are an error, never a crash.
  std::string bytes = SerializeRequestList(in);
  for (size_t cut : {size_t(0), size_t(3), bytes.size() / 2, bytes.size() - 1}) {
    RequestList bad;
    CHECK(!ParseRequestList(bytes.substr(0, cut), &bad).ok());
  }
  ResponseList bad;
  CHECK(!ParseResponseList(bytes, &bad).ok());
}

static void TestFusionLayout() {
  FusionLayout l = PlanFusion({8, 4, 0, 12});
  CHECK(l.total_bytes == 24);
  CHECK((l.offsets == std::vector<int64_t>{0, 8, 12, 12}));
  FusionBuffer buf;
  void* p = buf.Get(100);
  CHECK(p != nullptr && reinterpret_cast<uintptr_t>(p) % 64 == 0 && buf.capacity() >= 100);
  CHECK(buf.Get(50) == p);  // no reallocation when it fits
  CHECK(buf.Get(1000) != nullptr && buf.capacity() >= 1000);
}

// Whether the page holding `p` is mapped in this process.
static bool Mapped(const void* p) {
  uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  unsigned char resident;
  return mincore(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~(page - 1)),
                 size_t(page), &resident) == 0;
}

// A buffer that lives as long as a world goes back to the OS with it
// (mapped_buffer.h, issue 40). Freeing a large block raises glibc's mmap
// threshold, as happens early in any long-lived process; after that, a
// malloc'd buffer of the size would come from the heap and stay mapped once
// freed (and under ASan it stays mapped in the quarantine).
static void TestWorldBuffersGoBackToTheOs() {
  void* volatile big = std::malloc(8u << 20);
  std::free(big);
  const size_t mb = 1u << 20;
  void* p = nullptr;
  {
    FusionBuffer buf;
    p = buf.Get(int64_t(mb));
    CHECK(p != nullptr && Mapped(p));
    std::memset(p, 1, mb);
  }
  CHECK(!Mapped(p));

  MappedBuffer a(300u << 10);
  char* d = a.data();
  CHECK(d != nullptr && a.size() == (300u << 10) && d[0] == 0 && Mapped(d));
  a.Reserve(100);
  CHECK(a.data() == d);  // no new mapping when it fits
  MappedBuffer b = std::move(a);
  CHECK(b.data() == d && a.data() == nullptr && a.empty());
  b = MappedBuffer();
  CHECK(b.empty() && !Mapped(d));
}

static void TestReadinessAndOrder() {
  LocalController c(3);
  Submit(c, 0, {Req(0, "a"), Req(0, "b")});
  Submit(c, 1, {Req(1, "b")});
  CHECK(c.BuildResponseList().responses.empty());
  Submit(c, 2, {Req(2, "b"), Req(2, "a")});
  Submit(c, 1, {Req(1, "a")});
  ResponseList out = c.BuildResponseList();
  // Both fuse into one response, in the coordinator's arrival order.
  CHECK(out.responses.size() == 1);
  CHECK((out.responses[0].tensor_names == std::vector<std::string>{"a", "b"}));
  CHECK(c.BuildResponseList().responses.empty());
}

static void TestMismatches() {
  {
    LocalController c(2);
    Submit(c, 0, {Req(0, "x", CollectiveType::ALLREDUCE, DataType::FLOAT32, {2})});
    Submit(c, 1, {Req(1, "x", CollectiveType::ALLREDUCE, DataType::FLOAT32, {3})});
    auto out = c.BuildResponseList();
    CHECK(out.responses.size() == 1 && out.responses[0].type == ResponseType::ERROR);
    const std::string& m = out.responses[0].error_message;
    CHECK(Contains(m, "Mismatched ALLREDUCE tensor shapes"));
    CHECK(Contains(m, "One rank sent a tensor of shape [2], but another rank sent a tensor of shape [3]"));
    CHECK(Contains(m, "rank 0: [2]; rank 1: [3]") && Contains(m, "'x'"));
  }
  {
    LocalController c(3);
    Submit(c, 0, {Req(0, "x", CollectiveType::ALLREDUCE, DataType::FLOAT32)});
    Submit(c, 1, {Req(1, "x", CollectiveType::ALLREDUCE, DataType::INT32)});
    Submit(c, 2, {Req(2, "x", CollectiveType::ALLREDUCE, DataType::FLOAT32)});
    auto m = c.BuildResponseList().responses[0].error_message;
    CHECK(Contains(m, "Mismatched data types"));
    CHECK(Contains(m, "One rank had type float32, but another rank had type int32"));
    CHECK(Contains(m, "ranks 0, 2: float32; rank 1: int32"));
  }
  {
    LocalController c(2);
    Submit(c, 0, {Req(0, "x", CollectiveType::ALLREDUCE)});
    Submit(c, 1, {Req(1, "x", CollectiveType::ALLGATHER)});
    auto m = c.BuildResponseList().responses[0].error_message;
    CHECK(Contains(m, "Mismatched collective operations") && Contains(m, "ALLGATHER"));
  }
  {
    LocalController c(2);
    Request a = Req(0, "x", CollectiveType::BROADCAST), b = Req(1, "x", CollectiveType::BROADCAST);
    b.root_rank = 1;
    Submit(c, 0, {a});
    Submit(c, 1, {b});
    CHECK(Contains(c.BuildResponseList().responses[0].error_message, "Mismatched BROADCAST root ranks"));
    a.root_rank = b.root_rank = 5;
    a.name = b.name = "y";
    Submit(c, 0, {a});
    Submit(c, 1, {b});
    CHECK(Contains(c.BuildResponseList().responses[0].error_message, "Invalid BROADCAST root rank 5"));
  }
  {
    LocalController c(2);
    Request a = Req(0, "x"), b = Req(1, "x");
    b.reduce_op = ReduceOp::MAX;
    Submit(c, 0, {a});
    Submit(c, 1, {b});
    CHECK(Contains(c.BuildResponseList().responses[0].error_message, "reduce ops"));
    b = Req(1, "z");
    a = Req(0, "z");
    b.prescale_factor = 2;
    Submit(c, 0, {a});
    Submit(c, 1, {b});
    CHECK(Contains(c.BuildResponseList().responses[0].error_message, "prescale factors"));
  }
  {
    LocalController c(2);
    Request a = Req(0, "x", CollectiveType::ALLTOALL, DataType::FLOAT32, {4, 2});
    Request b = Req(1, "x", CollectiveType::ALLTOALL, DataType::FLOAT32, {4, 2});
    a.splits = {1, 3};
    b.splits = {2, 1};  // adds up to 3, not 4
    Submit(c, 0, {a});
    Submit(c, 1, {b});
    auto r = c.BuildResponseList().responses[0];
    CHECK(r.type == ResponseType::ERROR && Contains(r.error_message, "Invalid ALLTOALL splits"));
    CHECK(Contains(r.error_message, "rank 1"));
    b.splits = {2, 2};
    a.name = b.name = "ok";
    Submit(c, 0, {a});
    Submit(c, 1, {b});
    r = c.BuildResponseList().responses[0];
    CHECK(r.type == ResponseType::COLLECTIVE && (r.tensor_sizes == std::vector<int64_t>{1, 3, 2, 2}));
  }
  {
    LocalController c(2);
    Submit(c, 0, {Req(0, "g", CollectiveType::ALLGATHER, DataType::FLOAT32, {2, 3})});
    Submit(c, 1, {Req(1, "g", CollectiveType::ALLGATHER, DataType::FLOAT32, {5, 4})});
    CHECK(Contains(c.BuildResponseList().responses[0].error_message, "Mismatched ALLGATHER tensor shapes"));
    Submit(c, 0, {Req(0, "h", CollectiveType::ALLGATHER, DataType::FLOAT32, {2, 3})});
    Submit(c, 1, {Req(1, "h", CollectiveType::ALLGATHER, DataType::FLOAT32, {5, 3})});
    auto r = c.BuildResponseList().responses[0];
    CHECK(r.type == ResponseType::COLLECTIVE && (r.tensor_sizes == std::vector<int64_t>{2, 5}));
  }
}

// root_rank is a job-wide rank (Horovod's convention): the coordinator maps it
// to the root's rank within the set, and refuses a root outside the set.
static void TestBroadcastRootIsJobWide() {
  auto broadcast = [](LocalController& c, const std::string& name, int root) {
    for (int r = 0; r < c.size(); ++r) {
      Request q = Req(r, name, CollectiveType::BROADCAST);
      q.root_rank = root;
      Submit(c, r, {q});
    }
    auto responses = c.BuildResponseList().responses;
    CHECK(responses.size() == 1);
    return responses.empty() ? Response() : responses[0];
  };
  {
    LocalController c(std::vector<int>{1, 2});  // set [1, 2] of a larger job
    Response r = broadcast(c, "x", 1);
    CHECK(r.error_message.empty() && r.root_rank == 0);
    r = broadcast(c, "y", 2);
    CHECK(r.error_message.empty() && r.root_rank == 1);
    r = broadcast(c, "z", 0);
    CHECK(Contains(r.error_message, "Invalid BROADCAST root rank 0 for tensor 'z'"));
    CHECK(Contains(r.error_message, "process set's ranks [1, 2]"));
  }
  {
    LocalController c(std::vector<int>{1});
    CHECK(broadcast(c, "x", 1).root_rank == 0 && broadcast(c, "y", 1).error_message.empty());
    CHECK(Contains(broadcast(c, "z", 0).error_message, "process set's ranks [1]"));
  }
  {
    LocalController c(3);  // the global set: job-wide and set ranks are the same
    CHECK(broadcast(c, "x", 2).root_rank == 2);
    CHECK(Contains(broadcast(c, "y", 3).error_message, "the root must be in [0, 3)"));
  }
}

static void TestJoin() {
  LocalController c(3);
  Submit(c, 0, {Req(0, "join", CollectiveType::JOIN)});
  Submit(c, 1, {Req(1, "a")});
  CHECK(c.BuildResponseList().responses.empty());  // rank 2 has not submitted "a"
  Submit(c, 2, {Req(2, "a"), Req(2, "g", CollectiveType::ALLGATHER, DataType::FLOAT32, {1})});
  Submit(c, 1, {Req(1, "g", CollectiveType::ALLGATHER, DataType::FLOAT32, {1})});
  auto out = c.BuildResponseList();
  CHECK(out.responses.size() == 2);
  CHECK(out.responses[0].type == ResponseType::COLLECTIVE);  // allreduce goes ahead
  CHECK(out.responses[1].type == ResponseType::ERROR &&
        Contains(out.responses[1].error_message, "join"));
  Submit(c, 2, {Req(2, "join", CollectiveType::JOIN)});
  Submit(c, 1, {Req(1, "join", CollectiveType::JOIN)});
  out = c.BuildResponseList();
  CHECK(out.responses.size() == 1 && out.responses[0].collective == CollectiveType::JOIN);
  CHECK(out.responses[0].int_result == 1);  // rank 1 joined last
}

static void TestGroupsAndFusion() {
  LocalController c(2, /*threshold=*/32);
  auto g = [](int rank, int idx) {
    Request r = Req(rank, "g" + std::to_string(idx));
    r.group_name = "grp";
    r.group_size = 2;
    r.group_index = idx;
    return r;
  };
  Submit(c, 0, {g(0, 0), g(0, 1)});
  Submit(c, 1, {g(1, 0)});
  CHECK(c.BuildResponseList().responses.empty());  // a group waits for all members
  Submit(c, 1, {g(1, 1)});
  auto out = c.BuildResponseList();
  CHECK(out.responses.size() == 1 && out.responses[0].tensor_names.size() == 2);

  std::vector<Response> rs;
  for (int i = 0; i < 5; ++i) {
    Response r;
    r.tensor_names = {"t" + std::to_string(i)};
    r.dtype = i == 2 ? DataType::FLOAT64 : DataType::FLOAT32;
    r.tensor_sizes = {4};  // 16 bytes as float32
    rs.push_back(r);
  }
  auto fused = Controller::Fuse(rs, 32);
  // t0+t1 fill the 32-byte threshold; t2 is float64; t3+t4 fuse.
  CHECK(fused.size() == 3);
  CHECK((fused[0].tensor_names == std::vector<std::string>{"t0", "t1"}));
  CHECK((fused[1].tensor_names == std::vector<std::string>{"t2"}));
  CHECK((fused[2].tensor_names == std::vector<std::string>{"t3", "t4"}));
}

// A GPU tensor on one rank and a CPU tensor on another is a mismatch; GPU
// tensors on different ordinals are not. The device travels in both messages.
static void TestDeviceInMessages() {
  CHECK(DeviceName(kCpuDevice) == "CPU" && DeviceName(3) == "GPU:3");
  CHECK(Request().device == kCpuDevice);
  RequestList in;
  Request gpu = Req(1, "g");
  gpu.device = 2;
  in.requests = {gpu, Req(1, "c")};
  RequestList out;
  CHECK(ParseRequestList(SerializeRequestList(in), &out).ok());
  CHECK(out.requests.size() == 2 && out.requests[0].device == 2 &&
        out.requests[1].device == kCpuDevice && out.requests[0] == gpu);
  Request other = gpu;
  other.device = 1;
  CHECK(!(other == gpu));

  ResponseList rin, rout;
  Response r;
  r.tensor_names = {"g"};
  r.tensor_sizes = {4};
  r.devices = {0, 1, kCpuDevice};
  rin.responses = {r};
  CHECK(ParseResponseList(SerializeResponseList(rin), &rout).ok());
  CHECK(rout.responses.size() == 1 && rout.responses[0] == r);
  CHECK((rout.responses[0].devices == std::vector<int32_t>{0, 1, kCpuDevice}));
  CHECK(r.device_of(1) == 1 && r.device_of(2) == kCpuDevice && r.device_of(7) == kCpuDevice);
  std::string bytes = SerializeResponseList(rin);
  CHECK(!ParseResponseList(bytes.substr(0, bytes.size() - 2), &rout).ok());
}

static Request OnDevice(Request r, int32_t device) {
  r.device = device;
  return r;
}

static void TestDeviceMismatch() {
  {
    LocalController c(3);
    Submit(c, 0, {Req(0, "x")});
    Submit(c, 1, {OnDevice(Req(1, "x"), 0)});
    Submit(c, 2, {Req(2, "x")});
    auto out = c.BuildResponseList();
    CHECK(out.responses.size() == 1 && out.responses[0].type == ResponseType::ERROR);
    const std::string& m = out.responses[0].error_message;
    CHECK(Contains(m, "Mismatched devices for tensor 'x'"));
    CHECK(Contains(m, "One rank had a CPU tensor, but another rank had a GPU tensor"));
    CHECK(Contains(m, "(ranks 0, 2: CPU; rank 1: GPU:0)."));
  }
  {
    // Each rank on its own GPU: one collective, each rank's device recorded.
    LocalController c(2);
    Submit(c, 0, {OnDevice(Req(0, "x"), 0)});
    Submit(c, 1, {OnDevice(Req(1, "x"), 1)});
    auto out = c.BuildResponseList();
    CHECK(out.responses.size() == 1 && out.responses[0].type == ResponseType::COLLECTIVE);
    CHECK((out.responses[0].devices == std::vector<int32_t>{0, 1}));
  }
  {
    // Broadcast checks devices too (before it looks at shapes).
    LocalController c(2);
    Submit(c, 0, {OnDevice(Req(0, "b", CollectiveType::BROADCAST), 0)});
    Submit(c, 1, {Req(1, "b", CollectiveType::BROADCAST)});
    auto out = c.BuildResponseList();
    CHECK(out.responses.size() == 1 &&
          Contains(out.responses[0].error_message, "Mismatched devices for tensor 'b'"));
  }
}

// Fusion packs tensors into one buffer on one device: it never fuses across
// devices, on any rank.
static void TestFuseKeepsDevicesApart() {
  auto resp = [](const std::string& name, std::vector<int32_t> devices) {
    Response r;
    r.tensor_names = {name};
    r.tensor_sizes = {4};
    r.devices = std::move(devices);
    return r;
  };
  const std::vector<int32_t> cpu = {kCpuDevice, kCpuDevice}, gpu = {0, 0}, mixed = {0, 1};
  auto fused = Controller::Fuse({resp("c0", cpu), resp("g0", gpu), resp("c1", cpu),
                                 resp("m0", mixed), resp("g1", gpu), resp("m1", mixed)},
                                1 << 20);
  CHECK(fused.size() == 3);
  CHECK((fused[0].tensor_names == std::vector<std::string>{"c0", "c1"}) && fused[0].devices == cpu);
  CHECK((fused[1].tensor_names == std::vector<std::string>{"g0", "g1"}) && fused[1].devices == gpu);
  CHECK((fused[2].tensor_names == std::vector<std::string>{"m0", "m1"}) && fused[2].devices == mixed);

  // Through the coordinator: a CPU and a GPU allreduce submitted together
  // come back as two responses.
  LocalController c(2);
  for (int rank = 0; rank < 2; ++rank) Submit(c, rank, {Req(rank, "a"), OnDevice(Req(rank, "b"), 0)});
  auto out = c.BuildResponseList();
  CHECK(out.responses.size() == 2);
  CHECK(out.responses[0].tensor_names.size() == 1 && out.responses[1].tensor_names.size() == 1);

  // The response cache treats a tensor that moved to another device as new.
  ResponseCache cache(2);
  Request a = Req(0, "a");
  cache.Put(resp("a", cpu), &a);
  CHECK(cache.Matches(cache.Find("a"), a));
  CHECK(!cache.Matches(cache.Find("a"), OnDevice(a, 0)));
}

// A fake device event: not yet happened for `polls` queries, then `result`.
class CountdownEvent : public DeviceEvent {
 public:
  CountdownEvent(int polls, Status result) : left_(polls), result_(std::move(result)) {}
  Status Query() override {
    ++queries;
    if (left_ > 0) {
      --left_;
      return Status::InProgress();
    }
    return result_;
  }
  bool waits_on_device() const override { return on_device; }
  int queries = 0;
  bool on_device = false;

 private:
  int left_;
  Status result_;
};

// An entry is negotiated only once its input is ready; a failed ready event
// fails the entry without negotiating it.
static void TestReadyEvents() {
  TensorQueue q;
  std::vector<std::string> done;
  auto entry = [&](const std::string& name, std::shared_ptr<DeviceEvent> ready) {
    TensorTableEntry e;
    e.name = name;
    e.device = ready ? 0 : kCpuDevice;
    e.ready_event = std::move(ready);
    e.callback = [&done, name](const Status& s, int32_t) {
      done.push_back(name + (s.ok() ? ":ok" : ":" + s.message()));
    };
    return e;
  };
  auto slow = std::make_shared<CountdownEvent>(2, Status::OK());
  CHECK(q.Add(entry("gpu", slow), 1).ok());
  CHECK(q.Add(entry("cpu", nullptr), 1).ok());
  CHECK(q.Add(entry("bad", std::make_shared<CountdownEvent>(0, Status::Aborted("stream failed"))), 1)
            .ok());
  std::vector<Request> reqs;
  q.PopRequests(&reqs);
  CHECK(reqs.size() == 1 && reqs[0].name == "cpu" && reqs[0].request_rank == 1);
  CHECK((done == std::vector<std::string>{"bad:stream failed"}));
  CHECK(q.size() == 2);  // "bad" is gone; "gpu" waits
  reqs.clear();
  q.PopRequests(&reqs);
  CHECK(reqs.empty() && slow->queries == 2);
  q.PopRequests(&reqs);
  CHECK(reqs.size() == 1 && reqs[0].name == "gpu" && reqs[0].device == 0);
  TensorTableEntry taken;
  CHECK(q.Take("gpu", &taken) && taken.device == 0 && taken.ready_event == slow);

  // An event the device waits for (the executor's stream, at run time) does
  // not hold the request back, and the host never polls it.
  auto device_waits = std::make_shared<CountdownEvent>(1000, Status::OK());
  device_waits->on_device = true;
  CHECK(q.Add(entry("ordered", device_waits), 1).ok());
  reqs.clear();
  q.PopRequests(&reqs);
  CHECK(reqs.size() == 1 && reqs[0].name == "ordered" && device_waits->queries == 0);
  CHECK(!q.HasUnannounced());
}

int main() {
  TestSerialization();
  TestFusionLayout();
  TestWorldBuffersGoBackToTheOs();
  TestReadinessAndOrder();
  TestMismatches();
  TestBroadcastRootIsJobWide();
  TestJoin();
  TestGroupsAndFusion();
  TestDeviceInMessages();
  TestDeviceMismatch();
  TestFuseKeepsDevicesApart();
  TestReadyEvents();
  return CheckExitCode();
}
