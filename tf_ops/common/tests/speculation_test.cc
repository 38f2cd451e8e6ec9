// C++ unit tests of speculation (speculation.h): controllers in threads that
// skip negotiation in the steady state and fall back together, and the
// divergence flag riding in the fusion buffer. No TensorFlow, no MPI; run
// under sanitizers by tests/common/test_speculation_cpp.py.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../controller.h"
#include "../executor.h"
#include "../speculation.h"

#include "check.h"
#include "controller_harness.h"

using namespace tfring;

// --- Speculation: ranks that skip negotiation in the steady state, and
// fall back when one of them does something else.

// What one rank does: each step's batches are submitted in consecutive
// cycles, and the step ends once all of its tensors have a response (a
// JOIN step once the join completes). `shutdown_at`: from this step on,
// the rank asks for shutdown instead of submitting; `stop_at`: it stops
// submitting anything (and keeps cycling, as an idle background thread).
struct SpecScript {
  std::vector<Batches> steps;
  size_t shutdown_at = SIZE_MAX;
  size_t stop_at = SIZE_MAX;
  // The data plane fails in this rank's k-th speculative response (counted
  // from 0), after its flag went round: the tensors complete with an error.
  size_t fail_speculative_at = SIZE_MAX;
};
struct SpecResult {
  size_t steps_done = 0;
  std::map<std::string, Response> responses;
  std::map<std::string, int> runs;  // responses per tensor name
  SpeculationStats stats;
  int bit_rounds = 0, negotiations = 0;
  int bit_rounds_to_finish = -1;  // bit rounds until the script was done
  bool shutdown = false, join_done = false;
  std::vector<std::string> stalled;  // the coordinator's stalled tensors at the end
  bool negotiated_after_failure = false;  // the cycle after a failed response
};

// Runs until every rank has done `cycles` negotiated cycles (speculative
// ones, which send nothing, do not count: they are not in lockstep). A
// speculative response's flag goes through the same exchange as the
// negotiation, in the same order on every rank, as a data plane would.
static std::vector<SpecResult> RunSpeculativeJob(const std::vector<SpecScript>& scripts,
                                                 bool speculation, int cycles = 300,
                                                 std::chrono::microseconds cycle_sleep =
                                                     std::chrono::microseconds(0)) {
  const int n = static_cast<int>(scripts.size());
  Exchange ex(n);
  Config config;
  config.cache_capacity = 64;
  config.stall_check_time_s = 1.0;  // a hit (and a speculative wait) gives up after 0.5 s
  std::vector<SpecResult> results(n);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ThreadedController c(rank, n, config, &ex);
      c.set_speculation_allowed(speculation);
      const SpecScript& script = scripts[rank];
      SpecResult& res = results[rank];
      size_t batch = 0;
      std::vector<std::string> waiting;
      int normal = 0;
      size_t speculative_runs = 0;
      bool after_failure = false;
      while (normal < cycles) {
        const bool speculative_cycle = c.speculating();
        if (after_failure) res.negotiated_after_failure = !speculative_cycle;
        after_failure = false;
        RequestList mine;
        const size_t step = res.steps_done;
        if (step >= script.shutdown_at) {
          mine.shutdown = true;
          mine.shutdown_reason = "rank " + std::to_string(rank) + " shut down";
        } else if (step < script.steps.size() && step < script.stop_at &&
                   batch < script.steps[step].size()) {
          for (Request r : script.steps[step][batch]) {
            r.request_rank = rank;
            waiting.push_back(r.name);
            mine.requests.push_back(r);
          }
          ++batch;
        }
        ResponseList out;
        CHECK(c.ComputeResponseList(mine, &out).ok());
        bool fell_back = false;
        for (const Response& r : out.responses) {
          if (r.speculative) {
            if (fell_back) continue;
            const bool agreed = c.RunFlag(r.diverged);
            CHECK(!(agreed && r.diverged));
            const bool failed = !r.diverged && speculative_runs++ == script.fail_speculative_at;
            c.SpeculationResult(failed    ? SpeculationOutcome::FAILED
                                : agreed ? SpeculationOutcome::AGREED
                                         : SpeculationOutcome::FLAGGED);
            if (!agreed) {
              fell_back = true;
              continue;
            }
            // A failed response's tensors are done (with the error); nothing
            // after it in this list runs.
            fell_back = after_failure = failed;
          }
          if (r.collective == CollectiveType::JOIN && r.type == ResponseType::COLLECTIVE) {
            res.join_done = true;
            waiting.erase(std::remove(waiting.begin(), waiting.end(), kJoinName), waiting.end());
          }
          for (const std::string& name : r.tensor_names) {
            res.responses[name] = r;
            ++res.runs[name];
            waiting.erase(std::remove(waiting.begin(), waiting.end(), name), waiting.end());
          }
        }
        if (step < script.steps.size() && batch == script.steps[step].size() && waiting.empty()) {
          ++res.steps_done;
          batch = 0;
          if (res.steps_done == script.steps.size()) res.bit_rounds_to_finish = c.bit_rounds;
        }
        if (out.shutdown) {
          res.shutdown = true;
          break;
        }
        if (!speculative_cycle) {
          ++normal;
          if (cycle_sleep.count() > 0) std::this_thread::sleep_for(cycle_sleep);
        } else if (out.responses.empty()) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      }
      res.stats = c.speculation_stats();
      res.bit_rounds = c.bit_rounds;
      res.negotiations = c.negotiations;
      for (const auto& st : c.StalledTensors(0.0)) res.stalled.push_back(st.first.name);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// `reps` steps of each of `names`, one tensor per step (like a chain of
// eager allreduces), with the shape {4}.
static std::vector<Batches> Chain(const std::vector<std::string>& names, int reps) {
  std::vector<Batches> steps;
  for (int i = 0; i < reps; ++i)
    for (const auto& name : names) steps.push_back({{Req(0, name)}});
  return steps;
}

static bool AllCollective(const SpecResult& r) {
  for (const auto& kv : r.responses)
    if (kv.second.type != ResponseType::COLLECTIVE) return false;
  return true;
}

static void TestSpeculationDetector() {
  // Only agreed-on history counts, so the ranks enter at the same round;
  // a round is the tensors between two appearances of the same one.
  for (int n : {2, 3}) {
    std::vector<SpecScript> scripts(n, SpecScript{Chain({"a", "b", "c"}, 12)});
    auto res = RunSpeculativeJob(scripts, true);
    for (const auto& r : res) {
      CHECK(r.steps_done == 36);
      CHECK(AllCollective(r));
      CHECK(r.stats.entered >= 1);
      // Entered after a negotiated round and Speculation::kRounds agreed ones;
      // then one response per step.
      CHECK(r.stats.responses >= 36 - 3 * (Speculation::kRounds + 1) - 3);
      CHECK(r.bit_rounds_to_finish <= 3 * (Speculation::kRounds + 1) + 3);
      CHECK(r.runs.at("b") == 12);
      // Every tensor went through the coordinator once, and after that far
      // fewer bit rounds than cycles.
      CHECK(r.negotiations == 3);
      CHECK(r.stats.entered == res[0].stats.entered);
      CHECK(r.stats.responses == res[0].stats.responses);
    }
    // The same job without speculation negotiates every step.
    auto off = RunSpeculativeJob(scripts, false);
    for (const auto& r : off) {
      CHECK(r.steps_done == 36 && AllCollective(r));
      CHECK(r.stats.entered == 0 && r.stats.responses == 0);
      CHECK(r.bit_rounds_to_finish >= 36);
    }
  }
  {
    // A round that changes every time (a new tensor each step) never enters.
    std::vector<Batches> steps;
    for (int i = 0; i < 20; ++i) steps.push_back({{Req(0, "t" + std::to_string(i % 7))}});
    for (int i = 0; i < 20; ++i) steps.push_back({{Req(0, "u" + std::to_string(i))}});
    auto res = RunSpeculativeJob({SpecScript{steps}, SpecScript{steps}}, true);
    for (const auto& r : res) CHECK(r.steps_done == steps.size() && AllCollective(r));
  }
  {
    // An ineligible response (a reducescatter) keeps it off.
    std::vector<Batches> steps;
    for (int i = 0; i < 10; ++i) {
      steps.push_back({{Req(0, "a")}});
      steps.push_back({{Req(0, "rs", CollectiveType::REDUCESCATTER)}});
    }
    auto res = RunSpeculativeJob({SpecScript{steps}, SpecScript{steps}}, true);
    for (const auto& r : res) {
      CHECK(r.steps_done == steps.size() && AllCollective(r));
      CHECK(r.stats.entered == 0);
    }
  }
  {
    // Broadcasts, allgathers and allreduces of any type and op are
    // speculated too (their flag travels on its own).
    std::vector<Batches> steps;
    for (int i = 0; i < 12; ++i) {
      steps.push_back({{Req(0, "i", CollectiveType::ALLREDUCE, DataType::INT32)}});
      steps.push_back({{Req(0, "bc", CollectiveType::BROADCAST)}});
      steps.push_back({{Req(0, "ag", CollectiveType::ALLGATHER)}});
    }
    for (int n : {2, 3}) {
      auto res = RunSpeculativeJob(std::vector<SpecScript>(n, SpecScript{steps}), true);
      for (const auto& r : res) {
        CHECK(r.steps_done == steps.size() && AllCollective(r));
        CHECK(r.stats.entered >= 1);
        CHECK(r.stats.responses >= 12);
        CHECK(r.runs.at("bc") == 12 && r.runs.at("ag") == 12);
        CHECK(r.responses.at("bc").collective == CollectiveType::BROADCAST);
        CHECK(r.responses.at("ag").collective == CollectiveType::ALLGATHER);
      }
    }
  }
  Response r;
  r.tensor_names = {"x"};
  r.tensor_sizes = {4};
  r.devices = {kCpuDevice, kCpuDevice};
  CHECK(Speculation::Eligible(r) && Speculation::FlagRidesAlong(r));
  r.reduce_op = ReduceOp::AVERAGE;
  CHECK(Speculation::Eligible(r) && Speculation::FlagRidesAlong(r));
  // Other ops and types cannot carry the flag in their data.
  r.reduce_op = ReduceOp::MAX;
  CHECK(Speculation::Eligible(r) && !Speculation::FlagRidesAlong(r));
  r.reduce_op = ReduceOp::SUM;
  r.dtype = DataType::FLOAT16;
  CHECK(Speculation::Eligible(r) && !Speculation::FlagRidesAlong(r));
  r.dtype = DataType::FLOAT64;
  // Device tensors are speculated too, with the flag on its own: a device
  // plane only queues the data, so the flag could not be read back first.
  r.devices = {0, 1};
  CHECK(Speculation::Eligible(r) && !Speculation::FlagRidesAlong(r));
  r.devices = {kCpuDevice, kCpuDevice};
  // A large single tensor skips the fusion buffer's copies; float64: twice
  // the bytes.
  r.tensor_sizes = {Speculation::kFlagRidesMaxBytes / 8};
  CHECK(Speculation::FlagRidesAlong(r));
  r.tensor_sizes = {Speculation::kFlagRidesMaxBytes / 8 + 1};
  CHECK(Speculation::Eligible(r) && !Speculation::FlagRidesAlong(r));
  // A fused response pays the fusion buffer's copies on the normal path too.
  r.tensor_names = {"x", "y"};
  r.tensor_sizes = {Speculation::kFlagRidesMaxBytes, 4};
  CHECK(Speculation::FlagRidesAlong(r));
  r.collective = CollectiveType::BROADCAST;
  CHECK(!Speculation::Eligible(r));  // one tensor per broadcast
  r.tensor_names = {"x"};
  r.tensor_sizes = {4};
  CHECK(Speculation::Eligible(r) && !Speculation::FlagRidesAlong(r));
  r.collective = CollectiveType::ALLGATHER;
  r.tensor_sizes = {4, 2};  // each rank's first dimension
  CHECK(Speculation::Eligible(r) && !Speculation::FlagRidesAlong(r));
  for (CollectiveType t : {CollectiveType::ALLTOALL, CollectiveType::REDUCESCATTER,
                           CollectiveType::BARRIER, CollectiveType::JOIN}) {
    r.collective = t;
    CHECK(!Speculation::Eligible(r));
  }
  r.collective = CollectiveType::ALLREDUCE;
  r.type = ResponseType::ERROR;
  CHECK(!Speculation::Eligible(r));
}

static void TestSpeculationFallback() {
  const int reps = 12, at = 8 * 3 + 1;  // diverge at rep 8's "b"
  for (int n : {2, 3}) {
    {
      // Every rank moves to a tensor not in the schedule: one fallback, the
      // new tensor is negotiated, and the job goes back to speculating.
      std::vector<Batches> steps = Chain({"a", "b", "c"}, reps);
      steps.insert(steps.begin() + at, Batches{{Req(0, "new")}});
      auto res = RunSpeculativeJob(std::vector<SpecScript>(n, SpecScript{steps}), true);
      for (const auto& r : res) {
        CHECK(r.steps_done == steps.size() && AllCollective(r));
        CHECK(r.runs.at("new") == 1 && r.runs.at("b") == reps);
        CHECK(r.stats.fallbacks >= 1);
        CHECK(r.stats.entered >= 1);
      }
    }
    {
      // Only the last rank diverges: it submits "b" together with a tensor
      // the schedule does not have, while the others follow the schedule.
      std::vector<Batches> steps = Chain({"a", "b", "c"}, reps);
      std::vector<SpecScript> scripts(n, SpecScript{steps});
      scripts[0].steps.insert(scripts[0].steps.begin() + at + 1, Batches{{Req(0, "x")}});
      for (int k = 1; k < n - 1; ++k) scripts[k] = scripts[0];
      scripts[n - 1].steps[at] = Batches{{Req(0, "b"), Req(0, "x")}};
      auto res = RunSpeculativeJob(scripts, true);
      for (int k = 0; k < n; ++k) {
        CHECK(res[k].steps_done == scripts[k].steps.size() && AllCollective(res[k]));
        CHECK(res[k].runs.at("x") == 1 && res[k].runs.at("b") == reps);
        CHECK(res[k].stats.fallbacks >= 1);
      }
    }
    {
      // One rank changes a tensor's shape: the flag sends it back to the
      // coordinator, which gives every rank the mismatch error.
      std::vector<SpecScript> scripts(n, SpecScript{Chain({"a", "b", "c"}, reps)});
      scripts[n - 1].steps[at] = Batches{{Req(0, "b", CollectiveType::ALLREDUCE,
                                              DataType::FLOAT32, {8})}};
      auto res = RunSpeculativeJob(scripts, true);
      for (const auto& r : res) {
        CHECK(r.steps_done == scripts[0].steps.size());
        CHECK(r.stats.fallbacks >= 1);
        CHECK(r.runs.at("b") == reps);
        CHECK(r.responses.at("a").type == ResponseType::COLLECTIVE);
      }
      // The error is the last response for "b" only if it came at rep 8 and
      // "b" later ran again; look at the run count of errors instead.
      int errors = 0;
      for (const auto& r : res) {
        // Runs of "b" after the error overwrite responses["b"]; the count of
        // runs stays right and the error text is checked below.
        errors += r.responses.at("b").type == ResponseType::ERROR;
      }
      CHECK(errors == 0);  // later reps ran fine again
    }
    {
      // The same tensors in another order within a step's batch: the
      // schedule waits for the one due first, so nothing falls back.
      std::vector<SpecScript> scripts(n, SpecScript{Chain({"a", "b", "c"}, reps)});
      // Rank n-1 submits rep 9's "b" and "c" at once, "c" first.
      auto& s = scripts[n - 1].steps;
      const size_t b9 = 9 * 3 + 1;
      s[b9] = Batches{{Req(0, "c"), Req(0, "b")}};
      s.erase(s.begin() + b9 + 1);
      auto res = RunSpeculativeJob(scripts, true);
      for (int k = 0; k < n; ++k) {
        CHECK(res[k].steps_done == scripts[k].steps.size() && AllCollective(res[k]));
        CHECK(res[k].runs.at("c") == reps);
        // The only fallback is the one at the end (every rank idle).
        CHECK(res[k].stats.fallbacks == 1);
        CHECK(res[k].stats.responses >= reps * 3 - 3 * (Speculation::kRounds + 1) - 3);
      }
    }
  }
}

static void TestSpeculationPlaneFailure() {
  // The plane fails in a speculative response on every rank (as a dead peer
  // makes it): its tensors are done, with the error, and are not run again;
  // the next cycle negotiates, where a real transport would find the lost
  // peer; a healthy job goes back to speculating.
  const int reps = 24;
  for (int n : {2, 3}) {
    SpecScript script{Chain({"a", "b", "c"}, reps)};
    script.fail_speculative_at = 4;
    auto res = RunSpeculativeJob(std::vector<SpecScript>(n, script), true);
    for (const auto& r : res) {
      CHECK(r.steps_done == script.steps.size() && AllCollective(r));
      CHECK(r.runs.at("a") == reps && r.runs.at("b") == reps && r.runs.at("c") == reps);
      CHECK(r.stats.failures == 1);
      CHECK(r.negotiated_after_failure);
      CHECK(r.stats.entered >= 2);
    }
  }
}

static void TestSpeculationMismatchError() {
  // The shape mismatch above, checked for its error on the step it happens.
  const int at = 8 * 3 + 1;
  std::vector<SpecScript> scripts(2, SpecScript{Chain({"a", "b", "c"}, 9)});
  scripts[1].steps[at] = Batches{{Req(0, "b", CollectiveType::ALLREDUCE, DataType::FLOAT32, {8})}};
  scripts[0].steps.resize(at + 1);
  scripts[1].steps.resize(at + 1);
  auto res = RunSpeculativeJob(scripts, true);
  for (const auto& r : res) {
    CHECK(r.steps_done == at + 1);
    CHECK(r.stats.entered >= 1 && r.stats.fallbacks >= 1);
    CHECK(r.responses.at("b").type == ResponseType::ERROR);
    CHECK(Contains(r.responses.at("b").error_message, "Mismatched ALLREDUCE tensor shapes"));
  }
}

static void TestSpeculationJoinShutdownStall() {
  const int at = 8 * 3 + 1;
  for (int n : {2, 3}) {
    {
      // The last rank joins where it would have sent "b"; the others go on
      // for two more rounds (the joined rank adds zeros) and then join.
      std::vector<SpecScript> scripts(n);
      Request join = Req(0, kJoinName, CollectiveType::JOIN);
      for (int k = 0; k < n; ++k) {
        scripts[k].steps = Chain({"a", "b", "c"}, k == n - 1 ? 9 : 11);
        scripts[k].steps.resize(k == n - 1 ? at : scripts[k].steps.size());
        scripts[k].steps.push_back({{join}});
        // After the join, the steady state comes back.
        for (auto& step : Chain({"a", "b", "c"}, 8)) scripts[k].steps.push_back(step);
      }
      auto res = RunSpeculativeJob(scripts, true);
      for (int k = 0; k < n; ++k) {
        CHECK(res[k].steps_done == scripts[k].steps.size());
        CHECK(res[k].join_done);
        CHECK(AllCollective(res[k]));
        CHECK(res[k].stats.fallbacks >= 1);
        CHECK(res[k].stats.entered >= 2);
      }
      // (Once every rank has joined, the cycle before the join completes
      // also runs every cached allreduce with zeros on all ranks: the
      // normal path's doing, harmless, so "b" may count once more.)
      CHECK(res[0].runs.at("b") >= 11 + 8 && res[0].runs.at("b") <= 12 + 8);
    }
    {
      // The last rank shuts down instead of sending "b": every rank gets the
      // shutdown, none hangs in the speculative collective.
      std::vector<SpecScript> scripts(n, SpecScript{Chain({"a", "b", "c"}, 12)});
      scripts[n - 1].shutdown_at = at;
      auto res = RunSpeculativeJob(scripts, true);
      for (int k = 0; k < n; ++k) {
        CHECK(res[k].shutdown);
        CHECK(res[k].stats.fallbacks == 1);
        CHECK(res[k].steps_done == static_cast<size_t>(at));
      }
    }
    {
      // The last rank stops sending (a different code path): the others,
      // which hold "b", leave speculation after the patience and the
      // coordinator's stall inspector names "b".
      std::vector<SpecScript> scripts(n, SpecScript{Chain({"a", "b", "c"}, 12)});
      scripts[n - 1].stop_at = at;
      auto res = RunSpeculativeJob(scripts, true, 800, std::chrono::milliseconds(2));
      for (int k = 0; k < n; ++k) {
        CHECK(res[k].stats.fallbacks == 1);
        CHECK(res[k].steps_done == static_cast<size_t>(at));
      }
      CHECK(std::find(res[0].stalled.begin(), res[0].stalled.end(), "b") != res[0].stalled.end());
    }
  }
}

// The data-plane half: the flag rides in the fusion buffer, and outputs are
// written only when no rank raised it.
class SumOfRanksPlane : public DataPlane {
 public:
  // Adds what `others` would contribute: their buffers, element-wise.
  explicit SumOfRanksPlane(std::vector<std::vector<float>> others) : others_(std::move(others)) {}
  const char* name() const override { return "TEST"; }
  Status Allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op) override {
    if (dtype != DataType::FLOAT32 || op != ReduceOp::SUM) return Status::Unknown("unexpected");
    const float* src = static_cast<const float*>(in);
    float* dst = static_cast<float*>(out);
    for (int64_t i = 0; i < count; ++i) {
      float v = src[i];
      for (const auto& o : others_) v += o.at(i);
      dst[i] = v;
    }
    return Status::OK();
  }
  using DataPlane::Allreduce;
  Status Allgather(const void*, void*, const std::vector<int64_t>&) override { return Unused(); }
  Status Broadcast(void*, int64_t, int) override { return Unused(); }
  Status Alltoall(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&) override {
    return Unused();
  }
  Status Reducescatter(const void*, void*, const std::vector<int64_t>&, DataType, ReduceOp) override {
    return Unused();
  }
  Status Barrier() override { return Unused(); }

 private:
  static Status Unused() { return Status::Unknown("not used by this test"); }
  std::vector<std::vector<float>> others_;
};

static void TestSpeculativeAllreduce() {
  CpuExecutor ex;
  float a[3] = {1, 2, 3}, b[2] = {10, 20};
  float oa[3] = {-1, -1, -1}, ob[2] = {-1, -1};
  std::vector<ReduceSlot> slots = {{a, oa, 3}, {b, ob, 2}};
  auto phase = [](const std::string&, std::chrono::steady_clock::time_point) {};
  {
    // The peer agrees (flag 0): average of 2 ranks, outputs written.
    SumOfRanksPlane plane({{1, 1, 1, 1, 1, 0}});
    bool agreed = false;
    CHECK(RunSpeculativeAllreduce(ex, plane, slots, DataType::FLOAT32, ReduceOp::AVERAGE, 1.0, 1.0,
                                  2, false, &agreed, phase).ok());
    CHECK(agreed);
    CHECK(oa[0] == 1.0f && oa[2] == 2.0f && ob[0] == 5.5f && ob[1] == 10.5f);
  }
  {
    // The peer diverged (flag 1, zeros): nothing written.
    float ca[3] = {-1, -1, -1}, cb[2] = {-1, -1};
    std::vector<ReduceSlot> s2 = {{a, ca, 3}, {b, cb, 2}};
    SumOfRanksPlane plane({{0, 0, 0, 0, 0, 1}});
    bool agreed = true;
    CHECK(RunSpeculativeAllreduce(ex, plane, s2, DataType::FLOAT32, ReduceOp::SUM, 1.0, 1.0, 2,
                                  false, &agreed, phase).ok());
    CHECK(!agreed);
    CHECK(ca[0] == -1 && cb[1] == -1);
  }
  {
    // This rank diverges: it sends zeros and the flag, whatever its inputs.
    float ca[3] = {-1, -1, -1};
    std::vector<ReduceSlot> s3 = {{a, ca, 3}};
    SumOfRanksPlane plane({{0, 0, 0, 0}});
    bool agreed = true;
    CHECK(RunSpeculativeAllreduce(ex, plane, s3, DataType::FLOAT32, ReduceOp::SUM, 1.0, 1.0, 2,
                                  true, &agreed, phase).ok());
    CHECK(!agreed && ca[0] == -1);
  }
  {
    // A NaN in the data does not reach the flag.
    float na[2] = {std::nanf(""), 1}, out[2] = {0, 0};
    std::vector<ReduceSlot> s4 = {{na, out, 2}};
    SumOfRanksPlane plane({{1, 1, 0}});
    bool agreed = false;
    CHECK(RunSpeculativeAllreduce(ex, plane, s4, DataType::FLOAT32, ReduceOp::SUM, 2.0, 1.0, 2,
                                  false, &agreed, phase).ok());
    CHECK(agreed && std::isnan(out[0]) && out[1] == 3.0f);
  }
}

int main() {
  TestSpeculativeAllreduce();
  TestSpeculationDetector();
  TestSpeculationFallback();
  TestSpeculationPlaneFailure();
  TestSpeculationMismatchError();
  TestSpeculationJoinShutdownStall();
  return CheckExitCode();
}
