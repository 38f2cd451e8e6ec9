// Tests of how the shared-memory data plane (ops/shm_data_plane.*) fails,
// without MPI or TensorFlow: in forked jobs (shm_job.h), the last rank is
// killed, exits, or shuts its plane down and lives on while the others are
// in a collective (an allreduce; a broadcast on the single-copy path in
// "kill-broadcast"). The survivors' waits must end within seconds with a
// typed peer failure naming it, and the plane must stay failed.
//
//   shm_failures_test [--np N] [--timeout S]  (default np 2 and 3; each job
//                                             is given 60 s)
// Built and run by tests/common/test_shm_cpp.py (and by Bazel as
// //tf_ops:shm_failures_test).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../ops/shm_data_plane.h"
#include "check.h"
#include "shm_job.h"

using namespace tfring;
using namespace tfring::test;

namespace {

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
  std::printf("[rank %d] %s: %d checks, %d failed\n", rank, how, g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Each job is given 60 s, whatever --timeout says.
  return ShmTestMain("shm_failures_test", argc, argv, [](int size, double) {
    int failed = 0;
    for (const char* how : {"kill", "exit", "leave", "kill-broadcast"}) {
      std::printf("== np=%d: a rank %ss mid-job\n", size, how);
      failed += RunJob(size, 60, [how](Bus* b, int r, int n) { return RunFailure(b, r, n, how); },
                       true);
    }
    return failed;
  });
}
