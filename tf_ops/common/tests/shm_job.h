// The forked jobs of the shared-memory data plane's test programs
// (shm_plane_test.cc, shm_failures_test.cc) and its bench (bench/shm_bench.cc),
// without MPI or TensorFlow: the parent forks N rank processes which build
// planes over a fake bootstrap (a shared anonymous page with a barrier),
// watches them, kills the job if it runs too long instead of hanging, and
// checks that nothing is left in /dev/shm.
#ifndef TFRING_COMMON_TESTS_SHM_JOB_H
#define TFRING_COMMON_TESTS_SHM_JOB_H

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "../ops/shm_data_plane.h"
#include "../peer_monitor.h"
#include "../reduction.h"
#include "check.h"

namespace tfring {
namespace test {

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double CpuNow() {
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

inline Bus* NewBus() {
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

inline bool ShmHasEntriesOf(int pid) {
  const std::string prefix = "tfring-" + std::to_string(pid) + "-";
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = readdir(d)) found |= std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0;
  closedir(d);
  return found;
}

inline std::shared_ptr<PeerMonitor> MakeMonitor(Bus* bus, int rank, int size) {
  std::vector<PeerMonitor::Peer> peers;
  for (int r = 0; r < size; ++r) peers.push_back({r, bus->pids[r], "localhost"});
  return std::make_shared<PeerMonitor>(rank, "localhost", peers, 0.05);
}

inline Status MakePlane(FakeBootstrap& boot, std::shared_ptr<PeerMonitor> monitor, int rank, int size,
                 const ShmOptions& opts, std::unique_ptr<DataPlane>* out) {
  return CreateShmDataPlane(rank, size, &boot, std::move(monitor), opts, out);
}

// --- The parent: fork, watch, report --------------------------------------

// Forks `size` ranks that run `body` (on CPU r mod the CPUs each with
// `pin`), waits for them and returns how many failed: a rank that exits
// non-zero (but the last, the victim, with `expect_victim`), or a segment
// left in /dev/shm. Kills the ranks still running after `timeout_s`.
inline int RunJob(int size, double timeout_s, const std::function<int(Bus*, int, int)>& body,
                  bool expect_victim = false, bool pin = false) {
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
      g_check_rank = r;
      if (pin) {  // rank r on CPU r (mod the CPUs): no two ranks share one
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

// The options every shm program takes: --np N (repeated: one job each;
// default 2 and 3) and --timeout S. `more` takes any other option, reading
// its value with `next`, and returns false for one it does not know.
struct JobArgs {
  std::vector<int> sizes;
  double timeout = 240;
};
using MoreArgs =
    std::function<bool(const std::string& arg, const std::function<const char*()>& next)>;

inline bool ParseJobArgs(int argc, char** argv, JobArgs* args, const MoreArgs& more = nullptr) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::function<const char*()> next = [&]() { return i + 1 < argc ? argv[++i] : "0"; };
    if (a == "--np") {
      args->sizes.push_back(std::atoi(next()));
    } else if (a == "--timeout") {
      args->timeout = std::atof(next());
    } else if (!more || !more(a, next)) {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return false;
    }
  }
  if (args->sizes.empty()) args->sizes = {2, 3};
  for (int size : args->sizes) {
    if (size < 2 || size > 4) {
      std::fprintf(stderr, "--np must be 2..4 (the exact-value checks assume it)\n");
      return false;
    }
  }
  return true;
}

// The main of a shm test program: parses the options, runs `jobs` for each
// np (returning how many failed) and prints "<program>: all passed" or
// "<program>: FAILED"; returns the exit status.
inline int ShmTestMain(const char* program, int argc, char** argv,
                       const std::function<int(int size, double timeout)>& jobs) {
  JobArgs args;
  if (!ParseJobArgs(argc, argv, &args)) return 2;
  int failed = 0;
  for (int size : args.sizes) failed += jobs(size, args.timeout);
  std::printf("%s: %s\n", program, failed == 0 ? "all passed" : "FAILED");
  return failed == 0 ? 0 : 1;
}

}  // namespace test
}  // namespace tfring

#endif  // TFRING_COMMON_TESTS_SHM_JOB_H
