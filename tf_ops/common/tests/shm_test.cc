// Tests of what is particular to the shared-memory data plane, without MPI
// or TensorFlow (the collectives' results on every plane are the
// conformance suite's, conformance_test.cc): the parent forks N rank
// processes which build planes over a fake bootstrap (a shared anonymous
// page with a barrier) and check that the ranks agree on the single-copy
// path, that every element is reduced in rank order, the barrier, a huge
// message, and that nothing is left in /dev/shm. Separate jobs check that a
// dead or departed rank ends the others' waits with an error. The parent
// kills the job if it runs too long instead of hanging.
//
//   shm_test [--np N] [--timeout S]           run the tests (default np 2 and 3)
//   shm_test --bench --np N [--chunk B] [--small B] [--spin NS] [--bytes B]... [--pin]
//                [--skew US]                  the last rank starts each collective late
//                [--single-copy] [--single-copy-min B]
//                [--compare]                  alternate with a staged-only plane
//                [--collective C]             time C by size: allreduce (float32 Sum,
//                                             the default), allreduce-inplace,
//                                             reducescatter, broadcast,
//                                             broadcast-inplace, allgather, or memcpy
//                                             (the floor)
// Built and run by tests/common/test_shm_cpp.py (and by Bazel as //tf_ops:shm_test).
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../ops/shm_data_plane.h"
#include "../reduction.h"
#include "check.h"
#include "plane_data.h"

using namespace tfring;
using namespace tfring::test;

namespace {

int g_rank = -1;
bool g_pin = false;
double g_skew_us = 0;
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// --- The fake bootstrap: a page shared by the forked ranks -----------------

constexpr int kMaxRanks = 16;
constexpr int kBusBytes = 4096;

struct Bus {
  std::atomic<int> arrived;
  std::atomic<int> generation;
  std::atomic<int> go;
  int pids[kMaxRanks];
  char data[kMaxRanks][kBusBytes];
};

Bus* NewBus() {
  void* p = mmap(nullptr, sizeof(Bus), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(2);
  }
  return new (p) Bus();
}

// Broadcast, Allreduce (small) and Barrier through the bus: what the plane's
// set-up needs from a bootstrap. Waits give up after 30 s.
class FakeBootstrap : public DataPlane {
 public:
  FakeBootstrap(Bus* bus, int rank, int size) : bus_(bus), rank_(rank), size_(size) {}
  const char* name() const override { return "fake"; }

  Status Barrier() override {
    const int gen = bus_->generation.load();
    if (bus_->arrived.fetch_add(1) + 1 == size_) {
      bus_->arrived.store(0);
      bus_->generation.fetch_add(1);
      return Status::OK();
    }
    // Poll (yielding) at first, so ranks leave together as from an MPI
    // barrier: the benchmark starts each timed collective from one.
    const double start = Now(), deadline = start + 30;
    while (bus_->generation.load() == gen) {
      const double now = Now();
      if (now > deadline) return Status::Aborted("fake bootstrap barrier timed out");
      if (now - start < 0.005) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    return Status::OK();
  }
  Status Broadcast(void* buffer, int64_t bytes, int root) override {
    if (bytes > kBusBytes) return Status::InvalidArgument("fake broadcast too big");
    if (rank_ == root) std::memcpy(bus_->data[root], buffer, bytes);
    TFRING_RETURN_IF_ERROR(Barrier());
    if (rank_ != root) std::memcpy(buffer, bus_->data[root], bytes);
    return Barrier();
  }
  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* buffer, int64_t count, DataType dtype,
                   ReduceOp op) override {
    const int64_t bytes = count * DataTypeSize(dtype);
    if (bytes > kBusBytes) return Status::InvalidArgument("fake allreduce too big");
    std::memcpy(bus_->data[rank_], input, bytes);
    TFRING_RETURN_IF_ERROR(Barrier());
    std::memcpy(buffer, bus_->data[0], bytes);
    for (int j = 1; j < size_; ++j) TFRING_RETURN_IF_ERROR(ReduceInto(buffer, bus_->data[j], count, dtype, op));
    return Barrier();
  }
  // Every rank's value, in rank order (to compare results across ranks).
  std::vector<uint64_t> Gather(uint64_t v) {
    std::memcpy(bus_->data[rank_], &v, sizeof v);
    Barrier();
    std::vector<uint64_t> all(size_);
    for (int j = 0; j < size_; ++j) std::memcpy(&all[j], bus_->data[j], sizeof v);
    Barrier();
    return all;
  }
  Status Allgather(const void*, void*, const std::vector<int64_t>&) override { return Unused(); }
  Status Alltoall(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&) override {
    return Unused();
  }
  Status Reducescatter(const void*, void*, const std::vector<int64_t>&, DataType, ReduceOp) override {
    return Unused();
  }

 private:
  static Status Unused() { return Status::Unknown("not used by the set-up"); }
  Bus* bus_;
  int rank_, size_;
};

// --- Data ---------------------------------------------------------------

// --- Checks run by every rank ---------------------------------------------

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

bool ShmHasEntriesOf(int pid) {
  const std::string prefix = "tfring-" + std::to_string(pid) + "-";
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = readdir(d)) found |= std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0;
  closedir(d);
  return found;
}

std::shared_ptr<PeerMonitor> MakeMonitor(Bus* bus, int rank, int size) {
  std::vector<PeerMonitor::Peer> peers;
  for (int r = 0; r < size; ++r) peers.push_back({r, bus->pids[r], "localhost"});
  return std::make_shared<PeerMonitor>(rank, "localhost", peers, 0.05);
}

Status MakePlane(FakeBootstrap& boot, std::shared_ptr<PeerMonitor> monitor, int rank, int size,
                 const ShmOptions& opts, std::unique_ptr<DataPlane>* out) {
  return CreateShmDataPlane(rank, size, &boot, std::move(monitor), opts, out);
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

// A rank dies (or leaves) while the others are in a collective: they must get
// an error naming it within seconds, and the plane must stay failed.
int RunFailure(Bus* bus, int rank, int size, const char* how) {
  FakeBootstrap boot(bus, rank, size);
  std::unique_ptr<DataPlane> plane;
  // "kill-broadcast": the survivors are in a broadcast, on the single-copy
  // path where the system allows it.
  const bool broadcast = std::strcmp(how, "kill-broadcast") == 0;
  ShmOptions opts;
  opts.single_copy = true;
  opts.single_copy_min_bytes = 0;
  // Job-wide ranks differ from the plane's, so that the test sees which one
  // a departure names.
  opts.job_rank = 10 + rank;
  Status s = MakePlane(boot, MakeMonitor(bus, rank, size), rank, size, opts, &plane);
  CHECKF(s.ok(), "creating plane: %s", s.message().c_str());
  if (!s.ok()) return 1;
  std::vector<float> buf(1 << 20, 1.0f), out(1 << 20);
  CHECKF(plane->Allreduce(buf.data(), buf.size(), DataType::FLOAT32, ReduceOp::SUM).ok(), "first");
  CHECKF(plane->BroadcastOutOfPlace(buf.data(), out.data(), buf.size() * 4, 0).ok(), "broadcast");
  const int victim = size - 1;
  if (rank == victim) {
    if (std::strncmp(how, "kill", 4) == 0) kill(getpid(), SIGKILL);
    if (std::strcmp(how, "exit") == 0) _exit(0);
    plane.reset();  // "leave": this rank shuts its plane down and lives on
    std::this_thread::sleep_for(std::chrono::seconds(2));
    return 0;
  }
  const double start = Now();
  s = broadcast ? plane->BroadcastOutOfPlace(buf.data(), out.data(), buf.size() * 4, 0)
                : plane->Allreduce(buf.data(), buf.size(), DataType::FLOAT32, ReduceOp::SUM);
  const double took = Now() - start;
  CHECKF(s.code() == StatusCode::ABORTED, "%s: the collective must be aborted, got '%s'", how,
        s.message().c_str());
  CHECKF(s.message().find("rank") != std::string::npos, "error should name a rank: %s",
        s.message().c_str());
  CHECKF(took < 10, "%s noticed only after %.1f s", how, took);
  // Typed: a peer failure, naming the dead rank (the peer monitor's news,
  // also when it came through another survivor giving up); a rank that
  // left is named by the job-wide rank it wrote into the segment.
  const int named = std::strcmp(how, "leave") == 0 ? 10 + victim : victim;
  CHECKF(s.cause() == FailureCause::PEER_FAILURE && s.rank() == named,
        "%s: cause %d rank %d: %s", how, int(s.cause()), s.rank(), s.message().c_str());
  s = plane->Broadcast(buf.data(), 16, 0);
  CHECKF(s.code() == StatusCode::ABORTED, "a failed plane must stay failed: '%s'", s.message().c_str());
  CHECKF(s.cause() == FailureCause::PEER_FAILURE && s.rank() == named,
        "a failed plane keeps the failure's cause and rank: '%s'", s.message().c_str());
  if (rank == 0) std::printf("[rank %d] %s: %s (after %.2f s)\n", rank, how, s.message().c_str(), took);
  return g_failures == 0 ? 0 : 1;
}

// --- Benchmark -------------------------------------------------------------

int RunBench(Bus* bus, int rank, int size, const ShmOptions& opts,
             const std::vector<int64_t>& sizes, const std::string& collective, bool compare) {
  FakeBootstrap boot(bus, rank, size);
  // With --compare, a second plane with single copy off runs every
  // other iteration, so both see the same machine (it may be busy).
  std::vector<std::unique_ptr<DataPlane>> planes(compare ? 2 : 1);
  for (size_t v = 0; v < planes.size(); ++v) {
    ShmOptions o = opts;
    if (v == 1) o.single_copy = false;
    Status s = MakePlane(boot, MakeMonitor(bus, rank, size), rank, size, o, &planes[v]);
    if (!s.ok()) {
      std::fprintf(stderr, "plane: %s\n", s.message().c_str());
      return 1;
    }
  }
  for (int64_t bytes : sizes) {
    const int64_t n = bytes / 4;
    std::vector<float> buf(n, 1.0f);
    // Out of place, as the TF ops call them: a separate (warm) output. Sizes
    // follow nccl-tests: an allgather's `bytes` is its whole output.
    std::vector<float> out(n, 0.0f);
    const int64_t share = n / size * 4;
    const std::vector<int64_t> shares(size, share);
    auto run = [&](DataPlane* plane) -> Status {
      if (collective == "broadcast") return plane->BroadcastOutOfPlace(buf.data(), out.data(), bytes, 0);
      if (collective == "broadcast-inplace") {  // the root copies first, as before the fused path
        if (rank == 0) std::memcpy(out.data(), buf.data(), bytes);
        return plane->Broadcast(out.data(), bytes, 0);
      }
      if (collective == "allgather") return plane->Allgather(buf.data(), out.data(), shares);
      // In place (as after a prescale or a fusion copy); `out` holds zeros,
      // so its sums stay put however often it runs.
      if (collective == "allreduce-inplace") {
        return plane->Allreduce(out.data(), n, DataType::FLOAT32, ReduceOp::SUM);
      }
      if (collective == "reducescatter") {  // `bytes` is the whole input
        return plane->Reducescatter(buf.data(), out.data(), std::vector<int64_t>(size, n / size),
                                    DataType::FLOAT32, ReduceOp::SUM);
      }
      if (collective == "memcpy") {  // the floor: one copy of the message by every rank
        std::memcpy(out.data(), buf.data(), bytes);
        return Status::OK();
      }
      return plane->Allreduce(buf.data(), out.data(), n, DataType::FLOAT32, ReduceOp::SUM);
    };
    const int iters = bytes <= (1 << 20) ? 200 : (bytes <= (16 << 20) ? 20 : 8);
    std::vector<std::vector<double>> times(planes.size()), cpu(planes.size());
    for (int i = 0; i < iters + 2; ++i) {
      for (size_t v = 0; v < planes.size(); ++v) {
        boot.Barrier();
        const double c0 = CpuNow(), t0 = Now();
        // The last rank arrives late, as after a real negotiation.
        if (g_skew_us > 0 && rank == size - 1) {
          while (Now() - t0 < g_skew_us * 1e-6) {
          }
        }
        Status s = run(planes[v].get());
        const double t1 = Now(), c1 = CpuNow();
        if (!s.ok()) {
          std::fprintf(stderr, "%s: %s\n", collective.c_str(), s.message().c_str());
          return 1;
        }
        if (i >= 2) {
          times[v].push_back(t1 - t0);
          cpu[v].push_back(c1 - c0);
        }
      }
    }
    for (size_t v = 0; v < planes.size(); ++v) {
      std::sort(times[v].begin(), times[v].end());
      std::sort(cpu[v].begin(), cpu[v].end());
      const double med = times[v][times[v].size() / 2];
      // nccl-tests' bus bandwidth factors (a memcpy counts as a broadcast).
      const bool allreduce = collective.compare(0, 9, "allreduce") == 0;
      const double factor = allreduce                       ? 2.0 * (size - 1) / size
                            : collective == "allgather" ||
                                      collective == "reducescatter" ? 1.0 * (size - 1) / size
                                                                    : 1.0;
      const double busbw = factor * bytes / med / 1e9;
      // CPU time includes busy-polling, so it reads as "work + waiting" when
      // ranks have a core each; on a loaded machine it is the better guide.
      const char* path = !compare ? "" : (v == 0 ? " [as configured]" : " [staged]");
      if (rank == 0)
        std::printf("np=%d %s%s %9lld bytes: median %9.1f us (min %9.1f)  busbw %6.2f "
                    "GB/s  rank-0 CPU %9.1f us\n",
                    size, collective.c_str(), path, (long long)bytes, med * 1e6, times[v][0] * 1e6,
                    busbw, cpu[v][cpu[v].size() / 2] * 1e6);
    }
  }
  return 0;
}

// --- The parent: fork, watch, report --------------------------------------

int RunJob(int size, double timeout_s, const std::function<int(Bus*, int, int)>& body,
           bool expect_victim = false) {
  Bus* bus = NewBus();
  std::vector<pid_t> kids;
  for (int r = 0; r < size; ++r) {
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      g_rank = g_check_rank = r;
      if (g_pin) {  // rank r on CPU r (mod the CPUs): no two ranks share one
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(r % std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))), &set);
        sched_setaffinity(0, sizeof set, &set);
      }
      while (bus->go.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      int rc = body(bus, r, size);
      std::fflush(nullptr);
      _exit(rc);
    }
    kids.push_back(pid);
    bus->pids[r] = pid;
  }
  bus->go.store(1);
  const double deadline = Now() + timeout_s;
  int failed = 0;
  std::vector<bool> done(size, false);
  for (int left = size; left > 0;) {
    for (int r = 0; r < size; ++r) {
      int status = 0;
      if (done[r] || waitpid(kids[r], &status, WNOHANG) != kids[r]) continue;
      done[r] = true;
      --left;
      const bool victim = expect_victim && r == size - 1;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !victim) {
        std::fprintf(stderr, "rank %d failed (%s %d)\n", r, WIFEXITED(status) ? "exit" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        ++failed;
      }
    }
    if (left > 0 && Now() > deadline) {
      std::fprintf(stderr, "TIMEOUT after %.0f s: killing the ranks still running\n", timeout_s);
      for (int r = 0; r < size; ++r)
        if (!done[r]) kill(kids[r], SIGKILL);
      for (int r = 0; r < size; ++r)
        if (!done[r]) waitpid(kids[r], nullptr, 0);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (pid_t pid : kids) {
    if (ShmHasEntriesOf(pid)) {
      std::fprintf(stderr, "a tfring segment of pid %d is left in /dev/shm\n", pid);
      ++failed;
    }
  }
  munmap(bus, sizeof(Bus));
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes;
  double timeout = 240;
  bool bench = false;
  ShmOptions opts;
  std::vector<int64_t> bench_sizes;
  std::string collective = "allreduce";
  bool compare = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? argv[++i] : "0"; };
    if (a == "--np") sizes.push_back(std::atoi(next()));
    else if (a == "--timeout") timeout = std::atof(next());
    else if (a == "--bench") bench = true;
    else if (a == "--pin") g_pin = true;
    else if (a == "--skew") g_skew_us = std::atof(next());
    else if (a == "--chunk") opts.chunk_bytes = std::atoll(next());
    else if (a == "--small") opts.small_allreduce_bytes = std::atoll(next());
    else if (a == "--spin") opts.spin_ns = std::atoll(next());
    else if (a == "--bytes") bench_sizes.push_back(std::atoll(next()));
    else if (a == "--collective") collective = next();
    else if (a == "--single-copy") opts.single_copy = true;
    else if (a == "--compare") compare = true;
    else if (a == "--single-copy-min") opts.single_copy_min_bytes = std::atoll(next());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (sizes.empty()) sizes = {2, 3};
  if (bench_sizes.empty()) bench_sizes = {4LL << 10, 64LL << 10, 1LL << 20, 16LL << 20, 64LL << 20};
  int failed = 0;
  for (int size : sizes) {
    if (size < 2 || size > 4) {
      std::fprintf(stderr, "--np must be 2..4 (the exact-value checks assume it)\n");
      return 2;
    }
    if (bench) {
      failed += RunJob(size, timeout, [&](Bus* b, int r, int n) { return RunBench(b, r, n, opts, bench_sizes, collective, compare); });
      continue;
    }
    std::printf("== np=%d: collectives\n", size);
    failed += RunJob(size, timeout, RunCorrectness);
    for (const char* how : {"kill", "exit", "leave", "kill-broadcast"}) {
      std::printf("== np=%d: a rank %ss mid-job\n", size, how);
      failed += RunJob(size, 60, [how](Bus* b, int r, int n) { return RunFailure(b, r, n, how); },
                       true);
    }
  }
  std::printf("shm_test: %s\n", failed == 0 ? "all passed" : "FAILED");
  return failed == 0 ? 0 : 1;
}
