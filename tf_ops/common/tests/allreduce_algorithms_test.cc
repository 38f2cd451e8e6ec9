// Tests of the allreduce algorithms beside the ring (ops/allreduce_algorithms.*),
// built and run under ASan/UBSan by tests/common/test_core_cpp.py:
//   - recursive doubling and Rabenseifner over TCP worlds of 2 to 8 ranks on
//     threads (powers of two and the fold of the others), every dtype and
//     reduce op, in place and out of place, at counts below, at and above
//     the number of ranks (empty blocks) and across many blocks. Every rank's
//     result is compared bit for bit with the serial reference
//     (plane_data.h) wherever the data keep every order exact: always for
//     integers, MIN and MAX, for floating SUM, and for floating PRODUCT up
//     to 4 ranks (beyond, 3^p leaves float16's and bfloat16's exact
//     integers, and the order decides the rounding). There every rank must
//     still hold the same bits;
//   - the link-cost measurement gives every rank the same costs;
//   - the model's choices where the answer is clear.
// The same algorithms over MPI and TCP processes, at np=1, 2 and 3, are in
// the conformance suite (conformance_test.cc, planes ring/recursive-doubling
// and ring/rabenseifner).
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../ops/allreduce_algorithms.h"
#include "check.h"
#include "plane_data.h"
#include "tcp_threads.h"

using namespace tfring;
using namespace tfring::test;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";

struct Case {
  DataType dtype;
  ReduceOp op;
  int64_t count;
  bool in_place;
};

std::vector<Case> Cases(int n) {
  std::vector<Case> cases;
  bool in_place = false;
  for (DataType dt : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{n}, int64_t{n + 1},
                            int64_t{2 * n + 3}, int64_t{1001}}) {
        cases.push_back({dt, op, count, in_place});
        in_place = !in_place;
      }
    }
  }
  // Blocks of many KiB, as a real gradient's.
  cases.push_back({DataType::FLOAT32, ReduceOp::SUM, 70001, true});
  cases.push_back({DataType::FLOAT64, ReduceOp::MAX, 33333, false});
  return cases;
}

void TestAlgorithm(AllreduceAlgorithm algorithm, int n) {
  const char* name = AllreduceAlgorithmName(algorithm);
  const std::vector<Case> cases = Cases(n);
  // results[rank][case], checked on the main thread once the world is done
  // (the check counters are not for threads).
  std::vector<std::vector<std::vector<char>>> results(n, std::vector<std::vector<char>>(cases.size()));
  std::vector<std::vector<std::string>> errors(n);
  std::vector<int> inputs_kept(n, 1);
  tcp::TcpOptions options;
  options.secret = kSecret;
  options.connect_timeout = 60;
  RunThreads(n, options, [&](int r, std::shared_ptr<Communicator>& w) {
    AllreduceAlgorithms algorithms(w, 100);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      std::vector<char> in = Filled(c.count, c.dtype, r, static_cast<int>(i));
      const std::vector<char> original = in;
      std::vector<char> out(in.size(), static_cast<char>(0xA5));
      void* dst = c.in_place ? in.data() : out.data();
      Status s = algorithm == AllreduceAlgorithm::RECURSIVE_DOUBLING
                     ? algorithms.RecursiveDoubling(in.data(), dst, c.count, c.dtype, c.op)
                     : algorithms.Rabenseifner(in.data(), dst, c.count, c.dtype, c.op);
      if (!s.ok()) errors[r].push_back(s.message());
      if (!c.in_place && in != original) inputs_kept[r] = 0;
      results[r][i] = c.in_place ? in : out;
    }
  });
  for (int r = 0; r < n; ++r) {
    CHECKF(errors[r].empty(), "%s np=%d rank %d: %s", name, n, r,
           errors[r].empty() ? "" : errors[r][0].c_str());
    CHECKF(inputs_kept[r], "%s np=%d rank %d: an out-of-place input changed", name, n, r);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const int64_t bytes = c.count * DataTypeSize(c.dtype);
    const bool exact = !(IsFloat(c.dtype) && c.op == ReduceOp::PRODUCT && n > 4);
    const std::vector<char> want = Expected(c.count, c.dtype, c.op, n, static_cast<int>(i));
    for (int r = 0; r < n; ++r) {
      if (results[r][i].size() < static_cast<size_t>(bytes)) continue;  // failed above
      const char* ref = exact ? want.data() : results[0][i].data();
      const int64_t at = FirstDifference(results[r][i].data(), ref, bytes);
      CHECKF(at < 0, "%s np=%d rank %d %s %s n=%lld%s: first wrong byte %lld (against %s)", name,
             n, r, DataTypeName(c.dtype), ReduceOpName(c.op), (long long)c.count,
             c.in_place ? " in place" : "", (long long)at,
             exact ? "the serial reference" : "rank 0");
    }
  }
}

void TestMeasurement(int n) {
  std::vector<LinkCosts> costs(n);
  std::vector<int> ok(n, 0);
  tcp::TcpOptions options;
  options.secret = kSecret;
  options.connect_timeout = 60;
  RunThreads(n, options, [&](int r, std::shared_ptr<Communicator>& w) {
    AllreduceAlgorithms algorithms(w, 100);
    ok[r] = algorithms.MeasureLinkCosts(&costs[r]).ok();
  });
  for (int r = 0; r < n; ++r) {
    CHECKF(ok[r], "np=%d rank %d: the measurement failed", n, r);
    CHECKF(costs[r].alpha > 0 && costs[r].beta >= 0 && costs[r].gamma > 0 &&
               costs[r].short_beta >= 0 && costs[r].short_bytes > 0,
           "np=%d rank %d: alpha %g beta %g gamma %g short_beta %g", n, r, costs[r].alpha,
           costs[r].beta, costs[r].gamma, costs[r].short_beta);
    CHECKF(costs[r].alpha == costs[0].alpha && costs[r].beta == costs[0].beta &&
               costs[r].gamma == costs[0].gamma && costs[r].short_beta == costs[0].short_beta &&
               costs[r].short_bytes == costs[0].short_bytes,
           "np=%d rank %d: its costs differ from rank 0's, so the ranks could choose apart", n,
           r);
  }
}

void TestModel() {
  // A 1 Gbit/s link with 30 us per hop, and a reduction 30x faster than it.
  LinkCosts link;
  link.alpha = 30e-6;
  link.beta = 8e-9;
  link.gamma = 0.25e-9;
  for (int p : {2, 3, 4, 8, 16}) {
    // Tiny messages: the fewest hops, recursive doubling's log2 p.
    CHECKF(ChooseAllreduceAlgorithm(p, 64, link) == AllreduceAlgorithm::RECURSIVE_DOUBLING,
           "p=%d: 64 bytes should take recursive doubling", p);
    // Huge ones: the least data, overlapped with the reduction: the ring.
    CHECKF(ChooseAllreduceAlgorithm(p, 256 << 20, link) == AllreduceAlgorithm::RING,
           "p=%d: 256 MiB should take the ring", p);
  }
  // Between them, at a power of two with many ranks, Rabenseifner's
  // 2 log2 p hops beat the ring's 2(p-1) for the same bytes.
  CHECK(ChooseAllreduceAlgorithm(16, 256 << 10, link) == AllreduceAlgorithm::RABENSEIFNER);
  // The model's arithmetic: recursive doubling at p=4 is two full hops and
  // two reductions; the ring at p=2 is two hops of half the buffer.
  const double n = 1 << 20;
  const double rd = PredictAllreduceSeconds(AllreduceAlgorithm::RECURSIVE_DOUBLING, 4, 1 << 20,
                                            link);
  CHECK(std::abs(rd - 2 * (link.alpha + n * link.beta + n * link.gamma)) < 1e-12);
  const double ring = PredictAllreduceSeconds(AllreduceAlgorithm::RING, 2, 1 << 20, link);
  CHECK(std::abs(ring - (2 * link.alpha + n * link.beta)) < 1e-12);
  // One rank: nothing to do.
  CHECK(PredictAllreduceSeconds(AllreduceAlgorithm::RABENSEIFNER, 1, 1 << 20, link) == 0);

  // A link that passes a message's first 16 KB at 20x its line rate (a
  // token bucket's burst, as on the shaped links of cross_host.py). At 3
  // ranks, 4 KB goes by recursive doubling's three hops, where the plain
  // model, pricing all 4 KB at line rate, takes the ring's four smaller
  // ones; at 4 ranks, 64 KB goes by the ring's six hops of 16 KB, each
  // mostly burst, where the plain model takes Rabenseifner's fewer, larger
  // ones. (The measured times on those links order them so.)
  LinkCosts plain;
  plain.alpha = 25e-6;
  plain.beta = 8e-9;
  plain.gamma = 0.02e-9;
  LinkCosts burst = plain;
  burst.short_bytes = 16 << 10;
  burst.short_beta = 0.4e-9;
  CHECK(ChooseAllreduceAlgorithm(3, 4 << 10, plain) == AllreduceAlgorithm::RING);
  CHECK(ChooseAllreduceAlgorithm(3, 4 << 10, burst) == AllreduceAlgorithm::RECURSIVE_DOUBLING);
  CHECK(ChooseAllreduceAlgorithm(4, 64 << 10, plain) == AllreduceAlgorithm::RABENSEIFNER);
  CHECK(ChooseAllreduceAlgorithm(4, 64 << 10, burst) == AllreduceAlgorithm::RING);
  // A hop prices its head at short_beta and the rest at beta.
  CHECK(std::abs(burst.Hop(64 << 10) -
                 (25e-6 + (16 << 10) * 0.4e-9 + (48 << 10) * 8e-9)) < 1e-15);
  CHECK(std::abs(burst.Hop(4 << 10) - (25e-6 + (4 << 10) * 0.4e-9)) < 1e-15);
}

}  // namespace

int main() {
  signal(SIGPIPE, SIG_IGN);
  TestModel();
  for (int n = 2; n <= 8; ++n) {
    TestAlgorithm(AllreduceAlgorithm::RECURSIVE_DOUBLING, n);
    TestAlgorithm(AllreduceAlgorithm::RABENSEIFNER, n);
  }
  TestMeasurement(3);
  return CheckExitCode();
}
