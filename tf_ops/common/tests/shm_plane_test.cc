// Tests of what is particular to the shared-memory data plane
// (ops/shm_data_plane.*, ops/shm_single_copy.*), without MPI or TensorFlow
// (the collectives' results on every plane are the conformance suite's,
// conformance_test.cc): forked ranks (shm_job.h) check that they agree on
// the single-copy path, that every element is reduced in rank order, the
// barrier, a huge message, two planes used alternately, and that nothing is
// left in /dev/shm. What a dead or departed rank does to the others is
// shm_failures_test.cc's.
//
//   shm_plane_test [--np N] [--timeout S]     (default np 2 and 3)
// Built and run by tests/common/test_shm_cpp.py (and by Bazel as
// //tf_ops:shm_plane_test).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "../ops/shm_data_plane.h"
#include "../reduction.h"
#include "check.h"
#include "plane_data.h"
#include "shm_job.h"

using namespace tfring;
using namespace tfring::test;

namespace {

struct PlaneUnderTest {
  const char* label;
  std::unique_ptr<DataPlane> plane;
  int64_t chunk;  // bytes per rank per step, as configured
  int64_t single_copy_min = -1;  // where broadcast and allgather change paths (-1: never)
};

// Random floating-point values of mixed magnitude and sign, different on
// every rank: their sums and products depend on the order of the operations.
void FillMixed(void* buf, int64_t n, DataType dt, int rank, int salt) {
  std::mt19937 gen(1234 + rank * 977 + salt);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> exp(-10, 10);
  for (int64_t i = 0; i < n; ++i) {
    const double v = std::ldexp(mant(gen), exp(gen));
    if (dt == DataType::FLOAT32) static_cast<float*>(buf)[i] = static_cast<float>(v);
    if (dt == DataType::FLOAT64) static_cast<double*>(buf)[i] = v;
    if (dt == DataType::FLOAT16) static_cast<uint16_t*>(buf)[i] = FloatToHalf(static_cast<float>(v));
    if (dt == DataType::BFLOAT16) static_cast<uint16_t*>(buf)[i] = FloatToBFloat16(static_cast<float>(v));
  }
}

// The serial reduction of every rank's FillMixed values in rank order.
std::vector<char> InRankOrder(int64_t n, DataType dt, ReduceOp op, int size, int salt) {
  const int64_t bytes = std::max<int64_t>(n * DataTypeSize(dt), 1);
  std::vector<char> acc(bytes), other(bytes);
  FillMixed(acc.data(), n, dt, 0, salt);
  for (int r = 1; r < size; ++r) {
    FillMixed(other.data(), n, dt, r, salt);
    ReduceInto(acc.data(), other.data(), n, dt, op);
  }
  return acc;
}

// Every element is reduced in rank order, whichever rank reduces it: each
// rank's result is the serial reduction in rank order, bit for bit, for both
// allreduce paths (in place and out of place) and reducescatter.
void TestRankOrder(PlaneUnderTest& p, int rank, int size) {
  int salt = 900;
  for (DataType dt : {DataType::FLOAT32, DataType::FLOAT16, DataType::BFLOAT16, DataType::FLOAT64}) {
    const int64_t esize = DataTypeSize(dt), c = p.chunk / esize;
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::PRODUCT}) {
      for (int64_t n : {int64_t{5}, int64_t{3000}, size * c - 3, 3 * size * c + 11}) {
        for (bool in_place : {true, false}) {
          ++salt;
          std::vector<char> in(n * esize), out(n * esize, 0x5a);
          FillMixed(in.data(), n, dt, rank, salt);
          Status s = in_place ? p.plane->Allreduce(in.data(), n, dt, op)
                              : p.plane->Allreduce(in.data(), out.data(), n, dt, op);
          CHECKF(s.ok(), "%s rank-order allreduce: %s", p.label, s.message().c_str());
          const std::vector<char> want = InRankOrder(n, dt, op, size, salt);
          const int64_t at = FirstDifference(in_place ? in.data() : out.data(), want.data(), n * esize);
          CHECKF(at < 0, "%s allreduce %s %s n=%lld%s is not the rank-order result (byte %lld)",
                p.label, DataTypeName(dt), ReduceOpName(op), (long long)n,
                in_place ? " in place" : "", (long long)at);
        }
      }
      // Uneven shares, below and above a chunk, none a multiple of it.
      std::vector<int64_t> counts;
      for (int j = 0; j < size; ++j) counts.push_back(j % 2 ? 7 : 2 * c + 3 + j);
      int64_t total = 0, before = 0;
      for (int j = 0; j < size; ++j) {
        if (j < rank) before += counts[j];
        total += counts[j];
      }
      ++salt;
      std::vector<char> in(total * esize), out(counts[rank] * esize, 0x5a);
      FillMixed(in.data(), total, dt, rank, salt);
      Status s = p.plane->Reducescatter(in.data(), out.data(), counts, dt, op);
      CHECKF(s.ok(), "%s rank-order reducescatter: %s", p.label, s.message().c_str());
      const std::vector<char> want = InRankOrder(total, dt, op, size, salt);
      const int64_t at = FirstDifference(out.data(), want.data() + before * esize, counts[rank] * esize);
      CHECKF(at < 0, "%s reducescatter %s %s is not the rank-order result (byte %lld)", p.label,
            DataTypeName(dt), ReduceOpName(op), (long long)at);
    }
  }
}

// Ranks arrive at the barrier at different times; none may leave before the
// last has arrived.
void TestBarrier(PlaneUnderTest& p, Bus* bus, int rank, int size) {
  for (int round = 0; round < 5; ++round) {
    if (rank == round % size) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    bus->data[rank][0] = static_cast<char>(round + 1);
    Status s = p.plane->Barrier();
    CHECKF(s.ok(), "barrier: %s", s.message().c_str());
    for (int j = 0; j < size; ++j)
      CHECKF(bus->data[j][0] >= round + 1, "rank %d passed barrier %d before rank %d arrived", rank,
            round, j);
    CHECKF(p.plane->Barrier().ok(), "second barrier");  // nobody writes round+2 before all read
  }
}

void TestHuge(PlaneUnderTest& p, int rank, int size) {
  // 64 MiB + 3 bytes of uint8: many blocks and an odd tail.
  const int64_t n = (64LL << 20) + 3;
  std::vector<char> buf(n);
  Fill(buf.data(), n, DataType::UINT8, rank, 77);
  Status s = p.plane->Allreduce(buf.data(), n, DataType::UINT8, ReduceOp::SUM);
  CHECKF(s.ok(), "huge allreduce: %s", s.message().c_str());
  std::vector<char> want = Expected(n, DataType::UINT8, ReduceOp::SUM, size, 77);
  CHECKF(FirstDifference(buf.data(), want.data(), n) < 0, "huge allreduce wrong");
}

int RunCorrectness(Bus* bus, int rank, int size) {
  FakeBootstrap boot(bus, rank, size);
  auto monitor = MakeMonitor(bus, rank, size);
  std::vector<PlaneUnderTest> planes;
  // Default tuning, then tiny chunks (many steps, cheap) with and without the
  // one-step small-message path.
  // Broadcast and allgather go through the segment by default (single copy
  // is opt-in), in "4k-chunks" (refused by every rank) and in
  // "refused-by-last" (refused by one rank only: the others must follow it).
  // Where the system lets ranks read each other's memory (as root, or with
  // ptrace permission between them) they read the source rank's memory
  // directly from the default threshold on in "single-copy" (sizes around
  // it), and from any size in "single-copy-always".
  enum Copy { kDefault, kAllowed, kRefused, kRefusedByLast };
  struct Variant {
    const char* label;
    int64_t chunk;
    int64_t small;
    Copy copy;
    int64_t single_copy_min;
  } variants[] = {{"default", 0, -1, kDefault, -1},
                  {"4k-chunks", 4096, 0, kRefused, 0},
                  {"4k-chunks+small", 4096, 4096, kDefault, -1},
                  {"single-copy", 0, -1, kAllowed, -1},
                  {"refused-by-last", 4096, 0, kRefusedByLast, 0},
                  {"single-copy-always", 4096, 0, kAllowed, 0}};
  for (const auto& v : variants) {
    ShmOptions opts;
    opts.chunk_bytes = v.chunk;
    opts.small_allreduce_bytes = v.small;
    if (v.copy != kDefault) {
      opts.single_copy = v.copy == kAllowed || (v.copy == kRefusedByLast && rank != size - 1);
    }
    opts.single_copy_min_bytes = v.single_copy_min;
    PlaneUnderTest p{v.label, nullptr, 0};
    Status s = MakePlane(boot, monitor, rank, size, opts, &p.plane);
    CHECKF(s.ok(), "creating plane %s: %s", v.label, s.message().c_str());
    if (!s.ok()) return 1;
    // The chunk the plane picked: 512 KiB per slot by default (see shm_data_plane.cc).
    p.chunk = v.chunk > 0 ? v.chunk : ((512 * 1024 / size) + 4095) / 4096 * 4096;
    // Every rank must have made the same choice, and a refusal anywhere wins.
    const bool single = ShmSingleCopy(*p.plane);
    const std::vector<uint64_t> all = boot.Gather(single ? 1 : 0);
    for (int j = 0; j < size; ++j)
      CHECKF(all[j] == all[0], "%s: ranks disagree on the single-copy path", v.label);
    CHECKF(v.copy == kAllowed || !single, "%s: single copy on although off or refused", v.label);
    if (single) p.single_copy_min = v.single_copy_min >= 0 ? v.single_copy_min : 2 << 20;
    if (rank == 0)
      std::printf("[rank 0] plane %s: single copy %s\n", v.label, single ? "on" : "off");
    planes.push_back(std::move(p));
  }
  // The name is unlinked once everyone has mapped it (rank 0 does it before
  // it reaches this barrier).
  CHECKF(boot.Barrier().ok(), "bootstrap barrier");
  CHECKF(!ShmHasEntriesOf(bus->pids[0]), "a tfring segment is still in /dev/shm after set-up");

  for (size_t i = 0; i < 3; ++i) TestRankOrder(planes[i], rank, size);
  // Whatever the ranks agreed on, a broadcast from the last rank (the one
  // that refused, in "refused-by-last") arrives.
  for (size_t i = 3; i < planes.size(); ++i) {
    const int64_t n = 64 * 1024 + 5;
    std::vector<char> buf(n, 0), want(n);
    FillBytes(want.data(), n, size - 1, 1);
    if (rank == size - 1) buf = want;
    Status s = planes[i].plane->Broadcast(buf.data(), n, size - 1);
    CHECKF(s.ok() && FirstDifference(buf.data(), want.data(), n) < 0, "%s broadcast: %s",
           planes[i].label, s.message().c_str());
  }
  // Refused on every rank alike: an op that is not element-wise, a bad root.
  float x = 1;
  Status bad = planes[0].plane->Allreduce(&x, 1, DataType::FLOAT32, ReduceOp::AVERAGE);
  CHECKF(bad.code() == StatusCode::INVALID_ARGUMENT, "AVERAGE must be refused: %s",
         bad.message().c_str());
  char c = 0;
  CHECKF(planes[0].plane->Broadcast(&c, 1, size).code() == StatusCode::INVALID_ARGUMENT, "bad root");
  TestBarrier(planes[1], bus, rank, size);
  TestHuge(planes[0], rank, size);
  // Two planes used alternately keep their own step sequences.
  for (int i = 0; i < 20; ++i) {
    const int64_t n = 4096 + i;
    std::vector<char> buf = Filled(n, DataType::FLOAT32, rank, i);
    Status s = planes[i % 3].plane->Allreduce(buf.data(), n, DataType::FLOAT32, ReduceOp::SUM);
    CHECKF(s.ok() && FirstDifference(buf.data(), Expected(n, DataType::FLOAT32, ReduceOp::SUM,
                                                          size, i).data(), n * 4) < 0,
           "alternating planes: allreduce %d", i);
  }
  std::printf("[rank %d] %d checks, %d failed\n", rank, g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return ShmTestMain("shm_plane_test", argc, argv, [](int size, double timeout) {
    std::printf("== np=%d: collectives\n", size);
    return RunJob(size, timeout, RunCorrectness);
  });
}
