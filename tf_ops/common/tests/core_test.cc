// Unit tests of the framework-agnostic core that need neither TensorFlow nor
// MPI: message serialization, fusion planning, the coordinator's validation
// and ordering, the element-wise arithmetic, device-aware execution
// (executors, asynchronous completion, the data-plane selector). Built and run by
// tests/common/test_core_cpp.py (and by Bazel as //tf_ops:core_test).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../controller.h"
#include "../executor.h"
#include "../in_flight.h"
#include "../ops/data_plane_selector.h"
#include "../fusion_buffer.h"
#include "../message.h"
#include "../ops/adasum.h"
#include "../peer_monitor.h"
#include "../reduction.h"
#include "../response_cache.h"
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

static void TestArithmetic() {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333f}) {
    float back = HalfToFloat(FloatToHalf(f));
    CHECK(std::fabs(back - f) <= std::fabs(f) * 1e-3f + 1e-7f);
  }
  CHECK(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  for (float f : {0.0f, 1.0f, -3.0f, 1e30f, 0.1f}) {
    CHECK(std::fabs(BFloat16ToFloat(FloatToBFloat16(f)) - f) <= std::fabs(f) * 8e-3f);
  }
  int32_t a[3] = {1, 5, -2}, b[3] = {4, 2, 3};
  CHECK(ReduceInto(a, b, 3, DataType::INT32, ReduceOp::MAX).ok());
  CHECK(a[0] == 4 && a[1] == 5 && a[2] == 3);
  uint16_t h[2] = {FloatToHalf(1.5f), FloatToHalf(2.0f)}, h2[2] = {FloatToHalf(0.5f), FloatToHalf(3.0f)};
  CHECK(ReduceInto(h, h2, 2, DataType::FLOAT16, ReduceOp::SUM).ok());
  CHECK(HalfToFloat(h[0]) == 2.0f && HalfToFloat(h[1]) == 5.0f);
  uint8_t t[2] = {1, 0}, u[2] = {0, 0};
  CHECK(ReduceInto(t, u, 2, DataType::BOOL, ReduceOp::SUM).ok() && t[0] == 1 && t[1] == 0);
  int32_t avg[3] = {6, 7, -7};
  CHECK(FinishReduction(avg, 3, DataType::INT32, ReduceOp::AVERAGE, 1.0, 3).ok());
  CHECK(avg[0] == 2 && avg[1] == 2 && avg[2] == -2);
  float fa[2] = {3.0f, 6.0f};
  CHECK(FinishReduction(fa, 2, DataType::FLOAT32, ReduceOp::AVERAGE, 2.0, 3).ok());
  CHECK(std::fabs(fa[0] - 2.0f) < 1e-6f && std::fabs(fa[1] - 4.0f) < 1e-6f);
  CHECK(!ReduceInto(a, b, 3, DataType::INT32, ReduceOp::AVERAGE).ok());
}


// --- Several controllers in threads (controller_harness.h), so the
// response cache's protocol (bit allreduce + coordinator) runs for real.

// What each rank's script (controller_harness.h) came to.
struct RankResult {
  size_t steps_done = 0;
  std::map<std::string, Response> responses;  // by tensor name, the last one
  int negotiations = 0;                        // cycles that went to the coordinator
};

// Runs every rank's script for `cycles` cycles (the same on every rank, as
// the real background loops stay in lockstep); a hang shows up as a script
// that did not finish.
static std::vector<RankResult> RunJob(const std::vector<std::vector<Batches>>& scripts,
                                      int64_t cache_capacity, int cycles = 400) {
  const int n = static_cast<int>(scripts.size());
  Exchange ex(n);
  Config config;
  config.cache_capacity = cache_capacity;
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ThreadedController c(rank, n, config, &ex);
      // This harness keeps the ranks in lockstep by cycles; speculation,
      // which skips rounds, has its own (RunSpeculativeJob).
      c.set_speculation_allowed(false);
      RankResult& res = results[rank];
      size_t batch = 0;
      std::vector<std::string> waiting;
      for (int cycle = 0; cycle < cycles; ++cycle) {
        RequestList mine;
        if (res.steps_done < scripts[rank].size()) {
          const Batches& step = scripts[rank][res.steps_done];
          if (batch < step.size()) {
            for (Request r : step[batch]) {
              r.request_rank = rank;
              waiting.push_back(r.name);
              mine.requests.push_back(r);
            }
            ++batch;
          }
        }
        ResponseList out;
        Status s = c.ComputeResponseList(mine, &out);
        CHECK(s.ok());
        for (const Response& r : out.responses) {
          for (const std::string& name : r.tensor_names) {
            res.responses[name] = r;
            waiting.erase(std::remove(waiting.begin(), waiting.end(), name), waiting.end());
          }
        }
        if (res.steps_done < scripts[rank].size() &&
            batch == scripts[rank][res.steps_done].size() && waiting.empty()) {
          ++res.steps_done;
          batch = 0;
        }
      }
      res.negotiations = c.negotiations;
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

static Request Member(const std::string& group, int index, int size, TensorShape shape = {5}) {
  Request r = Req(0, group + "_" + std::to_string(index), CollectiveType::ALLREDUCE,
                  DataType::FLOAT32, shape);
  r.group_name = group;
  r.group_size = size;
  r.group_index = index;
  return r;
}

static bool AllSucceeded(const RankResult& r) {
  for (const auto& kv : r.responses) {
    if (kv.second.type != ResponseType::COLLECTIVE) return false;
  }
  return true;
}

static void TestCacheWithGroups() {
  // Issue 8, item 2: unnamed eager grouped allreduces of 1 and then 3 tensors
  // share the group name (the op's), so member _0 of both is one cache key.
  // From step 1 the 3-group's _0 misses (its entry holds the 1-group's) while
  // _1 and _2 hit: the group must still run as one, on every rank.
  for (int n : {2, 3}) {
    std::vector<Batches> steps;
    for (int s = 0; s < 3; ++s) {
      steps.push_back({{Member("HorovodGroupedAllreduce", 0, 1)}});
      steps.push_back({{Member("HorovodGroupedAllreduce", 0, 3),
                        Member("HorovodGroupedAllreduce", 1, 3),
                        Member("HorovodGroupedAllreduce", 2, 3)}});
    }
    auto results = RunJob(std::vector<std::vector<Batches>>(n, steps), 1024);
    for (const auto& r : results) {
      CHECK(r.steps_done == steps.size());
      CHECK(AllSucceeded(r));
    }
    // With the cache off the same script runs too (the reference behaviour).
    results = RunJob(std::vector<std::vector<Batches>>(n, steps), 0);
    for (const auto& r : results) CHECK(r.steps_done == steps.size());
  }

  {
    // One member changes shape between steps (the others stay cached), and
    // one rank submits its members over two cycles.
    std::vector<Batches> steps0, steps1;
    for (int s = 0; s < 4; ++s) {
      TensorShape a = s % 2 ? TensorShape{8} : TensorShape{4};
      steps0.push_back({{Member("g", 0, 3, a), Member("g", 1, 3), Member("g", 2, 3)}});
      steps1.push_back({{Member("g", 0, 3, a)}, {}, {Member("g", 1, 3), Member("g", 2, 3)}});
    }
    auto results = RunJob({steps0, steps1}, 1024);
    for (const auto& r : results) {
      CHECK(r.steps_done == steps0.size());
      CHECK(AllSucceeded(r));
    }
  }

  {
    // Steady state: a group that never changes hits the cache and needs no
    // coordinator after the first step.
    std::vector<Batches> steps(6, Batches{{Member("g", 0, 2), Member("g", 1, 2)}});
    auto results = RunJob({steps, steps}, 1024);
    for (const auto& r : results) {
      CHECK(r.steps_done == steps.size() && AllSucceeded(r));
      CHECK(r.responses.at("g_0").tensor_names.size() == 2);  // fused, as one group
      CHECK(r.negotiations == 1);
    }
  }

  {
    // Only rank 1 changes a member: its group goes to the coordinator while
    // rank 0's members all hit. Every member of the group gets an error on
    // every rank (nothing hangs), and the next step works.
    std::vector<Batches> steps0 = {{{Member("g", 0, 2), Member("g", 1, 2)}},
                                   {{Member("g", 0, 2), Member("g", 1, 2)}},
                                   {{Member("h", 0, 1)}}};
    std::vector<Batches> steps1 = steps0;
    steps1[1] = {{Member("g", 0, 2), Member("g", 1, 2, {6})}};
    auto results = RunJob({steps0, steps1}, 1024);
    for (const auto& r : results) {
      CHECK(r.steps_done == 3);
      CHECK(r.responses.at("g_0").type == ResponseType::ERROR);
      CHECK(r.responses.at("g_1").type == ResponseType::ERROR);
      CHECK(Contains(r.responses.at("g_1").error_message, "Mismatched ALLREDUCE tensor shapes"));
      CHECK(r.responses.at("h_0").type == ResponseType::COLLECTIVE);
    }
  }

  {
    // A cache too small for the working set: the least recently used slot
    // is reused for another tensor, evicting one member of a cached group.
    std::vector<Batches> steps;
    for (int s = 0; s < 5; ++s) {
      steps.push_back({{Member("g", 0, 2), Member("g", 1, 2)}});
      steps.push_back({{Req(0, "single_" + std::to_string(s % 2))}});
    }
    auto results = RunJob({steps, steps, steps}, 2);
    for (const auto& r : results) CHECK(r.steps_done == steps.size() && AllSucceeded(r));
  }
}

// --- Adasum over threads that exchange bytes through mailboxes.

class Mailboxes {
 public:
  void Send(int from, int to, std::string bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    boxes_[{from, to}].push_back(std::move(bytes));
    cv_.notify_all();
  }
  std::string Receive(int from, int to) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& box = boxes_[{from, to}];
    cv_.wait(lock, [&] { return !box.empty(); });
    std::string out = std::move(box.front());
    box.pop_front();
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, std::deque<std::string>> boxes_;
};

class ThreadPointToPoint : public PointToPoint {
 public:
  ThreadPointToPoint(int rank, int size, Mailboxes* boxes) : rank_(rank), size_(size), boxes_(boxes) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                  int peer) override {
    boxes_->Send(rank_, peer, std::string(static_cast<const char*>(send), send_bytes));
    std::string got = boxes_->Receive(peer, rank_);
    if (static_cast<int64_t>(got.size()) != recv_bytes) return Status::Unknown("size mismatch");
    if (recv_bytes > 0) std::memcpy(recv, got.data(), recv_bytes);
    return Status::OK();
  }

 private:
  int rank_, size_;
  Mailboxes* boxes_;
};

// The pairwise formula, tensor by tensor, in double.
static std::vector<double> AdasumPair(const std::vector<double>& a, const std::vector<double>& b,
                                      const std::vector<int64_t>& counts) {
  std::vector<double> out(a.size());
  int64_t off = 0;
  for (int64_t c : counts) {
    double dot = 0, aa = 0, bb = 0;
    for (int64_t j = off; j < off + c; ++j) {
      dot += a[j] * b[j];
      aa += a[j] * a[j];
      bb += b[j] * b[j];
    }
    const double ca = aa > 0 ? 1 - dot / (2 * aa) : 1, cb = bb > 0 ? 1 - dot / (2 * bb) : 1;
    for (int64_t j = off; j < off + c; ++j) out[j] = ca * a[j] + cb * b[j];
    off += c;
  }
  return out;
}

// Runs AdasumAllreduce on `inputs.size()` threads; returns each rank's buffer.
template <typename T>
static std::vector<std::vector<T>> RunAdasum(const std::vector<std::vector<T>>& inputs,
                                             const std::vector<int64_t>& counts, DataType dtype,
                                             std::vector<Status>* statuses) {
  const int n = static_cast<int>(inputs.size());
  Mailboxes boxes;
  std::vector<std::vector<T>> bufs = inputs;
  statuses->assign(n, Status::OK());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ThreadPointToPoint p2p(r, n, &boxes);
      std::vector<char> scratch;
      (*statuses)[r] = AdasumAllreduce(&p2p, bufs[r].data(), counts, dtype, &scratch);
    });
  }
  for (auto& t : threads) t.join();
  return bufs;
}

static void TestAdasum() {
  const std::vector<int64_t> counts = {5, 0, 3, 17, 1, 64};
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::mt19937 gen(7);
  std::normal_distribution<double> normal;
  for (int n : {1, 2, 4, 8}) {
    std::vector<std::vector<double>> inputs(n, std::vector<double>(total));
    for (auto& v : inputs)
      for (auto& x : v) x = normal(gen);
    // The binary tree the algorithm computes: pairs at distance 1, then 2, ...
    std::vector<std::vector<double>> tree = inputs;
    for (int d = 1; d < n; d <<= 1)
      for (int r = 0; r < n; r += 2 * d) tree[r] = AdasumPair(tree[r], tree[r + d], counts);
    std::vector<Status> st;
    auto out = RunAdasum(inputs, counts, DataType::FLOAT64, &st);
    for (int r = 0; r < n; ++r) {
      CHECK(st[r].ok());
      CHECK(out[r] == out[0]);  // the same bits everywhere
      for (int64_t j = 0; j < total; ++j) CHECK(std::fabs(out[r][j] - tree[0][j]) < 1e-9);
    }
    std::vector<std::vector<float>> inputs32(n);
    for (int r = 0; r < n; ++r) inputs32[r].assign(inputs[r].begin(), inputs[r].end());
    auto out32 = RunAdasum(inputs32, counts, DataType::FLOAT32, &st);
    for (int r = 0; r < n; ++r) {
      CHECK(st[r].ok() && out32[r] == out32[0]);
      for (int64_t j = 0; j < total; ++j) CHECK(std::fabs(out32[r][j] - tree[0][j]) < 1e-4);
    }
    std::vector<std::vector<uint16_t>> inputs16(n, std::vector<uint16_t>(total));
    for (int r = 0; r < n; ++r)
      for (int64_t j = 0; j < total; ++j) inputs16[r][j] = FloatToHalf(static_cast<float>(inputs[r][j]));
    auto out16 = RunAdasum(inputs16, counts, DataType::FLOAT16, &st);
    for (int r = 0; r < n; ++r) {
      CHECK(st[r].ok() && out16[r] == out16[0]);
      for (int64_t j = 0; j < total; ++j)
        CHECK(std::fabs(HalfToFloat(out16[r][j]) - tree[0][j]) < 0.05 * (1 + std::fabs(tree[0][j])));
    }
  }
  {
    // Orthogonal vectors add up; equal ones are kept as they are (not doubled).
    std::vector<std::vector<double>> in = {{1, 0, 2, 2}, {0, 3, 2, 2}};
    std::vector<Status> st;
    auto out = RunAdasum(in, {2, 2}, DataType::FLOAT64, &st);
    CHECK((out[0] == std::vector<double>{1, 3, 2, 2}));
    // A zero vector leaves the other one as it is.
    in = {{0, 0}, {4, 5}};
    out = RunAdasum(in, {2}, DataType::FLOAT64, &st);
    CHECK((out[1] == std::vector<double>{4, 5}));
  }
  {
    std::vector<Status> st;
    std::vector<std::vector<double>> in(3, std::vector<double>(4, 1.0));
    RunAdasum(in, {4}, DataType::FLOAT64, &st);
    CHECK(!st[0].ok() && Contains(st[0].message(), "power-of-two number of ranks"));
    std::vector<std::vector<int32_t>> ints(2, std::vector<int32_t>(4, 1));
    RunAdasum(ints, {4}, DataType::INT32, &st);
    CHECK(!st[0].ok() && Contains(st[0].message(), "not int32"));
  }
}

static void TestResponseCache() {
  ResponseCache cache(2);
  auto response = [](const std::string& name, int64_t n) {
    Response r;
    r.tensor_names = {name};
    r.tensor_sizes = {n};
    return r;
  };
  Request a = Req(0, "a"), b = Req(0, "b"), c = Req(0, "c");
  cache.Put(response("a", 4), &a);
  cache.Put(response("b", 4), &b);
  const int bit_a = cache.Find("a"), bit_b = cache.Find("b");
  CHECK(bit_a >= 0 && bit_b >= 0 && bit_a != bit_b);
  CHECK(cache.Matches(bit_a, a) && !cache.Matches(bit_a, b));
  Request a_bigger = Req(0, "a", CollectiveType::ALLREDUCE, DataType::FLOAT32, {8});
  CHECK(!cache.Matches(bit_a, a_bigger));  // same name, other shape: a miss
  cache.Use(bit_a);                         // b is now least recently used
  cache.Put(response("c", 4), &c);
  CHECK(cache.Find("b") == -1 && cache.Find("c") == bit_b && cache.Find("a") == bit_a);
  cache.Put(response("a", 8), &a_bigger);   // replaces a's entry in place
  CHECK(cache.Find("a") == bit_a && cache.Matches(bit_a, a_bigger));
  cache.Put(response("j", 4), nullptr);     // a rank that never submitted "j"
  CHECK(!cache.Matches(cache.Find("j"), Req(0, "j")));
  cache.Evict(cache.Find("j"));
  CHECK(cache.Find("j") == -1);
  CHECK(!ResponseCache(0).enabled());

  Response fused = response("x", 3);
  fused.tensor_names = {"x", "y"};
  fused.tensor_sizes = {3, 5};
  auto parts = SplitResponse(fused);
  CHECK(parts.size() == 2 && parts[1].tensor_names[0] == "y" && parts[1].tensor_sizes[0] == 5);
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
  int queries = 0;

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
}

// --- Device-aware execution ----------------------------------------------

// A data plane for tests: records what it was asked to run; Allreduce adds
// `peers` copies of the buffer (as if that many other ranks held the same
// values) or, when `stream` is set, queues that work there and returns
// InProgress like a GPU plane.
class FakePlane : public DataPlane {
 public:
  FakePlane(const char* name, bool gpu = false, int peers = 1) : name_(name), gpu_(gpu), peers_(peers) {}
  const char* name() const override { return name_; }
  bool on_gpu() const override { return gpu_; }
  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* buffer, int64_t count, DataType dtype,
                   ReduceOp op) override {
    calls.push_back(std::string("allreduce ") + ReduceOpName(op));
    last_in_place = input == buffer;
    auto work = [input, buffer, count, dtype, this] {
      CHECK(dtype == DataType::FLOAT32 || dtype == DataType::INT32);
      for (int64_t i = 0; i < count; ++i) {
        if (dtype == DataType::FLOAT32)
          static_cast<float*>(buffer)[i] = static_cast<const float*>(input)[i] * (1 + peers_);
        else
          static_cast<int32_t*>(buffer)[i] = static_cast<const int32_t*>(input)[i] * (1 + peers_);
      }
    };
    if (stream) {
      stream->push_back(work);
      return Status::InProgress();
    }
    work();
    return Status::OK();
  }
  Status Allgather(const void*, void*, const std::vector<int64_t>&) override { return Status::OK(); }
  Status Broadcast(void*, int64_t, int) override { return Status::OK(); }
  Status Alltoall(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&) override {
    return Status::OK();
  }
  // Rank `keep` of recv_counts.size() ranks: its share of the sum over 1 + peers ranks.
  Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& counts, DataType,
                       ReduceOp) override {
    calls.push_back("reducescatter");
    int64_t offset = 0;
    for (int r = 0; r < keep; ++r) offset += counts[r];
    for (int64_t i = 0; i < counts[keep]; ++i)
      static_cast<float*>(recv)[i] = static_cast<const float*>(send)[offset + i] * (1 + peers_);
    return Status::OK();
  }
  Status Barrier() override { return Status::OK(); }

  std::vector<std::string> calls;
  bool last_in_place = false;
  std::vector<std::function<void()>>* stream = nullptr;
  int keep = 0;

 private:
  const char* name_;
  bool gpu_;
  int peers_;
};

static PhaseFn Recorder(std::vector<std::string>* phases) {
  return [phases](const std::string& what, std::chrono::steady_clock::time_point) {
    phases->push_back(what);
  };
}

// Pack, scale and unpack on the CPU: fused and single-tensor paths, a joined
// rank's zeros, averaging, and reducescatter's prescale on a copy.
static void TestCpuExecutor() {
  CpuExecutor cpu;
  FakePlane plane("FAKE");  // two ranks holding the same values
  {
    float a[2] = {1, 2}, b[1] = {3}, out_a[2] = {0, 0}, out_b[1] = {0};
    std::vector<ReduceSlot> slots = {{a, out_a, 2}, {b, out_b, 1}, {nullptr, nullptr, 2}};
    PackedReduction packed;
    CHECK(cpu.PackAllreduce(slots, DataType::FLOAT32, 2.0, &packed).ok());
    CHECK(packed.fused && packed.count == 5 && packed.buffer == cpu.FusionBuffer(20));
    CHECK((packed.layout.offsets == std::vector<int64_t>{0, 8, 12}));
    const float* buf = static_cast<const float*>(packed.buffer);
    CHECK(buf[0] == 2 && buf[1] == 4 && buf[2] == 6 && buf[3] == 0 && buf[4] == 0);
    CHECK(a[0] == 1 && a[1] == 2);  // inputs untouched
    CHECK(plane.Allreduce(packed.buffer, packed.count, DataType::FLOAT32, ReduceOp::SUM).ok());
    CHECK(cpu.UnpackAllreduce(packed, slots, DataType::FLOAT32, ReduceOp::AVERAGE, 0.5, 2).ok());
    // (x * 2 prescale) * 2 ranks / 2 (average) * 0.5 postscale = x
    CHECK(out_a[0] == 1 && out_a[1] == 2 && out_b[0] == 3);
  }
  {
    // One tensor is reduced from its input straight into its output: no
    // fusion buffer, no phases for it, and no staging copy (the plane gets
    // the input and the output, not the output with the input copied in).
    int32_t in[3] = {6, 7, -7}, out[3] = {0, 0, 0};
    std::vector<std::string> phases;
    RunResult run = RunAllreduce(cpu, plane, {{in, out, 3}}, DataType::INT32, ReduceOp::AVERAGE,
                                 1.0, 1.0, 3, Recorder(&phases));
    CHECK(run.status.ok() && !run.pending);
    CHECK(!plane.last_in_place);
    // (x * 2) / 3 with C truncation: 12/3, 14/3, -14/3
    CHECK(out[0] == 4 && out[1] == 4 && out[2] == -4 && in[0] == 6 && in[1] == 7 && in[2] == -7);
  }
  {
    // A prescale must not touch the input: the output is then scaled in
    // place and reduced there.
    float in[2] = {1, 2}, out[2] = {0, 0};
    std::vector<std::string> phases;
    RunResult run = RunAllreduce(cpu, plane, {{in, out, 2}}, DataType::FLOAT32, ReduceOp::SUM,
                                 3.0, 1.0, 2, Recorder(&phases));
    CHECK(run.status.ok() && plane.last_in_place);
    CHECK(out[0] == 6 && out[1] == 12 && in[0] == 1 && in[1] == 2);
    CHECK((phases == std::vector<std::string>{"FAKE_ALLREDUCE"}));
    CHECK((plane.calls.back() == "allreduce Sum"));  // AVERAGE is a SUM on the plane
  }
  {
    float x[2] = {1, 2}, y[2] = {3, 4}, ox[2], oy[2];
    std::vector<std::string> phases;
    RunResult run = RunAllreduce(cpu, plane, {{x, ox, 2}, {y, oy, 2}}, DataType::FLOAT32,
                                 ReduceOp::SUM, 1.0, 1.0, 2, Recorder(&phases));
    CHECK(run.status.ok() && ox[0] == 2 && ox[1] == 4 && oy[0] == 6 && oy[1] == 8);
    CHECK((phases == std::vector<std::string>{"MEMCPY_IN_FUSION_BUFFER", "FAKE_ALLREDUCE",
                                              "MEMCPY_OUT_FUSION_BUFFER"}));
  }
  {
    // bool cannot be prescaled: the error comes back and the plane is not asked.
    uint8_t t[2] = {1, 0}, o[2];
    const size_t before = plane.calls.size();
    std::vector<std::string> phases;
    RunResult run = RunAllreduce(cpu, plane, {{t, o, 2}}, DataType::BOOL, ReduceOp::SUM, 2.0,
                                 1.0, 2, Recorder(&phases));
    CHECK(!run.status.ok() && Contains(run.status.message(), "bool") && plane.calls.size() == before);
  }
  {
    // Reducescatter over 2 ranks, this rank (1) keeps elements [2, 4).
    float in[4] = {1, 2, 3, 4}, out[2] = {0, 0};
    plane.keep = 1;
    std::vector<std::string> phases;
    RunResult run = RunReducescatter(cpu, plane, in, out, {2, 2}, 1, DataType::FLOAT32,
                                     ReduceOp::AVERAGE, 3.0, 1.0, Recorder(&phases));
    // 3 * x * 2 ranks / 2
    CHECK(run.status.ok() && out[0] == 9 && out[1] == 12);
    CHECK(in[2] == 3 && in[3] == 4);  // prescaled on a copy, not on the input
    CHECK((phases == std::vector<std::string>{"FAKE_REDUCESCATTER"}));
    const void* send = nullptr;
    void* recv = nullptr;
    CHECK(cpu.PackReducescatter(in, 4, out, DataType::FLOAT32, 1.0, &send, &recv).ok());
    CHECK(send == in && recv == out);  // nothing to scale: no copy
  }
}

// One executor per device and staging kind, made once; GPU tensors without a
// GPU build are a clear error.
static void TestExecutorTable() {
  ExecutorTable none;
  Executor* ex = nullptr;
  Executor* again = nullptr;
  CHECK(none.Get(kCpuDevice, false, &ex).ok() && ex->device() == kCpuDevice);
  CHECK(none.Get(kCpuDevice, false, &again).ok() && again == ex);
  Status s = none.Get(0, false, &ex);
  CHECK(!s.ok() && s.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(Contains(s.message(), "no GPU support") && Contains(s.message(), "GPU:0"));
  CHECK(!none.Get(kCpuDevice, true, &ex).ok());  // CPU tensors never go to a GPU plane

  struct FakeGpuExecutor : CpuExecutor {
    FakeGpuExecutor(int32_t d, bool staged) : device_(d), staged(staged) {}
    int32_t device() const override { return device_; }
    int32_t device_;
    bool staged;
  };
  std::vector<std::string> made;
  ExecutorTable table([&made](int32_t device, bool staged, std::unique_ptr<Executor>* out) {
    made.push_back(DeviceName(device) + (staged ? " staged" : " direct"));
    out->reset(new FakeGpuExecutor(device, staged));
    return Status::OK();
  });
  Executor *direct = nullptr, *staged = nullptr, *other = nullptr;
  CHECK(table.Get(0, true, &direct).ok() && table.Get(0, false, &staged).ok());
  CHECK(table.Get(1, true, &other).ok() && table.Get(0, true, &again).ok());
  CHECK(direct != staged && direct != other && again == direct);
  CHECK(!static_cast<FakeGpuExecutor*>(direct)->staged && static_cast<FakeGpuExecutor*>(staged)->staged);
  CHECK((made == std::vector<std::string>{"GPU:0 direct", "GPU:0 staged", "GPU:1 direct"}));
  // Each executor has its own fusion buffer.
  CHECK(table.Get(kCpuDevice, false, &ex).ok() && ex->FusionBuffer(64) != direct->FusionBuffer(64));
}

// An executor that behaves like a device: its steps are queued on a stream
// and run only when its fence is found complete, after `polls` queries.
class FakeStreamExecutor : public CpuExecutor {
 public:
  explicit FakeStreamExecutor(int polls) : polls_(polls) {}
  int32_t device() const override { return 0; }
  Status Copy(void* dst, const void* src, int64_t bytes) override {
    stream.push_back([=] { std::memcpy(dst, src, bytes); });
    return Status::InProgress();
  }
  Status Zero(void* dst, int64_t bytes) override {
    stream.push_back([=] { std::memset(dst, 0, bytes); });
    return Status::InProgress();
  }
  Status Scale(void* buf, int64_t count, DataType dtype, double factor) override {
    stream.push_back([=] { ScaleBuffer(buf, count, dtype, factor); });
    return Status::InProgress();
  }
  Status FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op, double post,
                         int ranks) override {
    stream.push_back([=] { tfring::FinishReduction(buf, count, dtype, op, post, ranks); });
    return Status::InProgress();
  }
  std::unique_ptr<DeviceEvent> Fence() override {
    if (stream.empty()) return nullptr;
    struct Event : DeviceEvent {
      std::vector<std::function<void()>> work;
      int polls;
      int* queries;
      Status Query() override {
        ++*queries;
        if (polls-- > 0) return Status::InProgress();
        for (auto& w : work) w();
        work.clear();
        return Status::OK();
      }
    };
    auto e = std::make_unique<Event>();
    e->work.swap(stream);
    e->polls = polls_;
    e->queries = &queries;
    return e;
  }
  std::vector<std::function<void()>> stream;
  int queries = 0;

 private:
  int polls_;
};

// A plane that returns InProgress: the collective completes only once the
// polled event has happened, and the background thread's loop (InFlight)
// never blocks on it.
static void TestAsyncCompletion() {
  FakeStreamExecutor gpu(3);
  FakePlane nccl("FAKE_GPU", true);
  nccl.stream = &gpu.stream;
  float a[2] = {1, 2}, b[2] = {3, 4}, oa[2] = {0, 0}, ob[2] = {0, 0};
  std::vector<std::string> phases;
  RunResult run = RunAllreduce(gpu, nccl, {{a, oa, 2}, {b, ob, 2}}, DataType::FLOAT32,
                               ReduceOp::SUM, 1.0, 1.0, 2, Recorder(&phases));
  CHECK(run.status.in_progress() && run.pending != nullptr);
  CHECK(oa[0] == 0 && ob[1] == 0);  // nothing has run yet
  CHECK(gpu.stream.empty());        // the fence took all the queued work

  InFlight in_flight;
  std::vector<std::string> finished;
  in_flight.Add(std::move(run.pending), [&finished](const Status& s) {
    finished.push_back(s.ok() ? "first" : "first failed");
  });
  // A second collective started after the first, whose device work fails.
  struct Failing : DeviceEvent {
    Status Query() override { return Status::Aborted("device error"); }
  };
  in_flight.Add(std::make_unique<Failing>(), [&finished](const Status& s) {
    finished.push_back("second: " + s.message());
  });
  CHECK(in_flight.Poll() == 1 && in_flight.size() == 1);
  CHECK((finished == std::vector<std::string>{"second: device error"}));
  CHECK(in_flight.Poll() == 0 && in_flight.Poll() == 0 && oa[0] == 0);
  CHECK(in_flight.Poll() == 1 && in_flight.empty());  // the 4th query sees it done
  CHECK(gpu.queries == 4 && finished.back() == "first");
  CHECK(oa[0] == 2 && oa[1] == 4 && ob[0] == 6 && ob[1] == 8);

  // A plane left running with an executor that cannot wait for it.
  CpuExecutor cpu;
  std::vector<std::function<void()>> nowhere;
  nccl.stream = &nowhere;
  run = RunAllreduce(cpu, nccl, {{a, oa, 2}}, DataType::FLOAT32, ReduceOp::SUM, 1.0, 1.0, 2,
                     Recorder(&phases));
  CHECK(!run.status.ok() && !run.status.in_progress() && Contains(run.status.message(), "no event"));

  // Shutdown: what does not finish in time is completed with the reason.
  FakeStreamExecutor slow(1 << 30);
  slow.stream.push_back([] {});
  InFlight stuck;
  Status got;
  stuck.Add(slow.Fence(), [&got](const Status& s) { got = s; });
  stuck.Drain(0.01, Status::Aborted("shut down"));
  CHECK(stuck.empty() && got.code() == StatusCode::ABORTED && got.message() == "shut down");
}

// The selector picks by device, then by size.
static void TestSelectorByDevice() {
  auto* fallback = new FakePlane("MPI");
  auto* shm = new FakePlane("SHM");
  DataPlaneChoice choice;
  choice.shm_min_bytes = 1024;
  DataPlaneSelector sel{std::unique_ptr<DataPlane>(fallback), std::unique_ptr<DataPlane>(shm),
                        nullptr, choice};
  // Before any collective, last_used() names the real fallback plane.
  CHECK(std::string(sel.last_used()) == "MPI");
  CHECK(sel.Select(CollectiveType::ALLREDUCE, kCpuDevice, 100) == fallback);
  CHECK(sel.Select(CollectiveType::ALLREDUCE, kCpuDevice, 4096) == shm);
  CHECK(std::string(sel.last_used()) == "SHM");
  // No GPU plane: GPU tensors take the host planes (host staged).
  CHECK(!sel.has_gpu() && sel.Select(CollectiveType::ALLREDUCE, 0, 4096) == shm);
  CHECK(sel.Select(CollectiveType::ALLTOALL, 0, 4096) == fallback);

  auto* gpu = new FakePlane("GPU", true);
  sel.set_gpu(std::unique_ptr<DataPlane>(gpu));
  for (CollectiveType t : {CollectiveType::ALLREDUCE, CollectiveType::ALLGATHER,
                           CollectiveType::BROADCAST, CollectiveType::ALLTOALL,
                           CollectiveType::REDUCESCATTER}) {
    CHECK(sel.Select(t, 0, 10) == gpu && sel.Select(t, 3, 1 << 20) == gpu);
  }
  CHECK(std::string(sel.last_used()) == "GPU");
  CHECK(sel.Select(CollectiveType::ALLREDUCE, kCpuDevice, 4096) == shm);
  CHECK(sel.Select(CollectiveType::ALLREDUCE, kCpuDevice, 10) == fallback);
  // Used as a plane itself, the selector moves host memory only.
  float x[300] = {1};
  CHECK(sel.Allreduce(x, 300, DataType::FLOAT32, ReduceOp::SUM).ok());
  CHECK(shm->calls.size() == 1 && gpu->calls.empty() && x[0] == 2);

  // The executor follows the chosen plane's memory.
  ExecutorTable table([](int32_t, bool staged, std::unique_ptr<Executor>* out) {
    out->reset(new FakeStreamExecutor(staged ? 1 : 2));
    return Status::OK();
  });
  Executor* ex = nullptr;
  DataPlane* plane = sel.Select(CollectiveType::ALLREDUCE, 0, 10);
  CHECK(table.Get(0, plane->on_gpu(), &ex).ok() && ex->device() == 0);
}

// The peer monitor names a dead peer and tells its listener (the TCP world,
// which then tells the other ranks) once, with the job-wide rank.
void TestPeerMonitorListener() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  CHECK(child > 0);
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);  // reaped: its pid is free now
  PeerMonitor monitor(0, "h", {{0, int(getpid()), "h"}, {3, int(child), "h"}, {5, 1, "other"}},
                      0.0);
  std::vector<int> told;
  monitor.set_on_death([&told](int rank) { told.push_back(rank); });
  Status s = monitor.Check();
  CHECK(s.code() == StatusCode::ABORTED);
  CHECK(s.cause() == FailureCause::PEER_FAILURE && s.rank() == 3);
  CHECK(s.message().find("rank 3 (pid " + std::to_string(child)) != std::string::npos);
  CHECK(monitor.Check().code() == StatusCode::ABORTED);  // the same news, not told again
  CHECK(told == std::vector<int>{3});
}

// A layer that adds words to a failure keeps what it is.
void TestStatusKeepsItsCause() {
  Status s = Status::PeerFailed(2, "rank 2 is gone");
  Status told = s.WithMessage(s.message() + " (while waiting for x)");
  CHECK(told.code() == StatusCode::ABORTED && told.cause() == FailureCause::PEER_FAILURE);
  CHECK(told.rank() == 2 && told.message() == "rank 2 is gone (while waiting for x)");
  CHECK(Status::Mismatch("m").code() == StatusCode::PRECONDITION_ERROR);
  CHECK(Status::PreconditionError("m").cause() == FailureCause::MISMATCH);
  CHECK(Status::NotInitialized("n").cause() == FailureCause::NOT_INITIALIZED);
  CHECK(Status::Shutdown("s", 1).rank() == 1 && Status::Timeout("t").rank() == -1);
  CHECK(Status::OK().cause() == FailureCause::NONE);
}

int main() {
  TestStatusKeepsItsCause();
  TestPeerMonitorListener();
  TestResponseCache();
  TestCacheWithGroups();
  TestAdasum();
  TestSerialization();
  TestFusionLayout();
  TestReadinessAndOrder();
  TestMismatches();
  TestBroadcastRootIsJobWide();
  TestJoin();
  TestGroupsAndFusion();
  TestArithmetic();
  TestDeviceInMessages();
  TestDeviceMismatch();
  TestFuseKeepsDevicesApart();
  TestReadyEvents();
  TestCpuExecutor();
  TestExecutorTable();
  TestAsyncCompletion();
  TestSelectorByDevice();
  return CheckExitCode();
}
