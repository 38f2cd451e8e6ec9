// Unit tests of the response cache: alone, and between controllers in
// threads (controller_harness.h), so that its protocol (the bit allreduce
// and the coordinator) runs for real, groups included. Built and run by
// tests/common/test_core_cpp.py (and by Bazel as //tf_ops:response_cache_test).

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../message.h"
#include "../response_cache.h"

#include "check.h"
#include "controller_harness.h"

using namespace tfring;

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

int main() {
  TestResponseCache();
  TestCacheWithGroups();
  return CheckExitCode();
}
