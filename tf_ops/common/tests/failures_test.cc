// Unit tests of how the core names failures: the peer monitor (a dead peer
// by pid, a silent one through the transport's probe) and Status causes.
// Built and run by tests/common/test_core_cpp.py (and by Bazel as
// //tf_ops:failures_test).

#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "../peer_monitor.h"
#include "../status.h"

#include "check.h"

using namespace tfring;

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

// A peer that is alive but silent (stopped, or cut off) is found by the
// transport's heartbeats, not by its pid: the monitor passes the transport's
// status on, with its cause and rank, so that waits outside the transport
// (the shared-memory plane) end too.
static void TestPeerMonitorAsksTheTransport() {
  PeerMonitor monitor(0, "h", {{0, int(getpid()), "h"}, {1, int(getpid()), "h"}}, 0.0);
  Status transport;
  int asked = 0;
  monitor.set_transport_probe([&]() {
    ++asked;
    return transport;
  });
  CHECK(monitor.Check().ok() && asked == 1);
  transport = Status::PeerFailed(1, "rank 1 sent nothing for 3.0 s");
  Status s = monitor.Check();
  CHECK(s.code() == StatusCode::ABORTED && s.cause() == FailureCause::PEER_FAILURE);
  CHECK(s.rank() == 1 && s.message() == "rank 1 sent nothing for 3.0 s");
  transport = Status::OK();
  CHECK(monitor.Check().rank() == 1);  // the news stays
  // Without peers on this host the monitor still asks.
  PeerMonitor remote_only(0, "h", {{0, int(getpid()), "h"}, {1, 1, "other"}}, 0.0);
  CHECK(remote_only.Check().ok());
  remote_only.set_transport_probe([] { return Status::PeerFailed(1, "gone"); });
  CHECK(remote_only.Check().rank() == 1);
}

int main() {
  TestStatusKeepsItsCause();
  TestPeerMonitorListener();
  TestPeerMonitorAsksTheTransport();
  return CheckExitCode();
}
