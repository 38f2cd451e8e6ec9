// Tests of the TCP communicator (transport/tcp/tcp_communicator.*) in one
// process, built and run under ASan/UBSan by
// tests/common/transport/test_tcp_communicator.py (and by Bazel as
// //tf_ops:tcp_comm_test): worlds of 1, 2 and 3 ranks on threads over real
// loopback sockets (there is no global state, so several worlds, one after
// another, live in one process), orderly close, a peer's death reported by
// another, and bad arguments. The same exchanges between processes, and what
// only separate processes can show (a killed or stopped rank, strangers at a
// listener), are ranks/tcp_comm_rank.cc's.
#include <signal.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../transport/tcp/socket.h"
#include "../transport/tcp/tcp_communicator.h"
#include "check.h"
#include "tcp_exchange.h"
#include "tcp_threads.h"

using namespace tfring;
using namespace tfring::tcp;
using namespace tfring::test;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";

void TestInProcess() {
  TcpOptions options;
  options.secret = kSecret;
  options.connect_timeout = 60;
  for (int n : {2, 3}) {
    RunThreads(n, options, [](int, std::shared_ptr<Communicator>& w) { Exchange(*w); });
  }
  // A second and third world in the same process (elastic re-forms the job
  // this way): nothing global survives a world.
  for (int round = 0; round < 2; ++round) {
    RunThreads(3, options, [](int, std::shared_ptr<Communicator>& w) { Collectives(*w); });
  }
  // Orderly close: rank 0 sends, then leaves; rank 1 still gets the message,
  // sees no error while it has nothing pending, and a later send to rank 0
  // fails naming it.
  RunThreads(2, options, [](int r, std::shared_ptr<Communicator>& w) {
    if (r == 0) {
      CHECK(Send(*w, "last", 1, 3).ok());
      w.reset();
      return;
    }
    Sleep(0.5);
    std::string in(4, 'x');
    CHECK(Recv(*w, &in, 0, 3).ok() && in == "last");
    CommRequestPtr req;
    CHECK(w->Isend("x", 1, 0, 3, &req).ok());
    bool done = false;
    Status s = w->Test(req.get(), &done);
    CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "rank 0 (host thread-host-0)") &&
          Contains(s.message(), "closed its connection"));
    CHECK(s.cause() == FailureCause::PEER_FAILURE && s.rank() == 0);
  });
  // A peer that leaves in order while this rank waits for it fails the
  // world: the wait ends with ABORTED naming it, not a hang.
  RunThreads(2, options, [](int r, std::shared_ptr<Communicator>& w) {
    if (r == 0) {
      std::string ready(1, 'x');
      CHECK(Recv(*w, &ready, 1, 5).ok());
      w.reset();
      return;
    }
    std::string never(8, 'x');
    CommRequestPtr req;
    CHECK(w->Irecv(&never[0], 8, 0, 6, &req).ok());
    CHECK(Send(*w, "r", 0, 5).ok());
    Status s = w->Wait(req.get(), "a message rank 0 never sends", false);
    CHECK(s.code() == StatusCode::ABORTED &&
          Contains(s.message(), "tfring stopped: rank 0 (host thread-host-0) closed its "
                                "connection in the middle of an exchange") &&
          Contains(s.message(), "while waiting for a message rank 0 never sends"));
    // Naming the step keeps the failure's cause and rank.
    CHECK(s.cause() == FailureCause::PEER_FAILURE && s.rank() == 0);
    CHECK(never == std::string(8, 'x'));
  });
  // Rank 0 learns from its peer monitor that rank 2's process is gone and
  // leaves at once, while rank 1 still waits for it: rank 1 must name rank 2,
  // the first to die, and not rank 0, whose connection closes first.
  RunThreads(3, options, [](int r, std::shared_ptr<Communicator>& w) {
    if (r == 0) {
      std::string ready(1, 'x');
      CHECK(Recv(*w, &ready, 1, 5).ok());
      w->PeerProcessExited(2);
      w.reset();
      return;
    }
    std::string never(8, 'x');
    CommRequestPtr req;
    CHECK(w->Irecv(&never[0], 8, 0, 6, &req).ok());
    if (r == 1) CHECK(Send(*w, "r", 0, 5).ok());
    Status s = w->Wait(req.get(), "a message rank 0 never sends", false);
    CHECK(s.code() == StatusCode::ABORTED);
    if (r == 1) {
      CHECK(Contains(s.message(), "tfring stopped: rank 2 (host thread-host-2) has exited or "
                                  "was killed (reported by rank 0)"));
      CHECK(s.cause() == FailureCause::PEER_FAILURE && s.rank() == 2);
    }
  });
  // A world of one rank works (self messages, collectives).
  RunThreads(1, options, [](int, std::shared_ptr<Communicator>& w) {
    SelfAndBadArgs(*w);
    Collectives(*w);
  });
  // Bad arguments name the problem.
  std::unique_ptr<TcpListener> l;
  CHECK(TcpListener::Open("127.0.0.1", 0, &l).ok());
  std::shared_ptr<Communicator> w;
  TcpOptions weak;
  weak.secret = "short";
  Status s = ConnectTcpWorld(0, {{l ? l->address() : "", "h"}}, std::move(l), weak, &w);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "secret"));
  s = TcpListener::Open("127.0.0.1", 70000, &l);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "70000"));
  // A rank whose peer never comes fails after connect_timeout naming it.
  TcpOptions quick = options;
  quick.connect_timeout = 1;
  CHECK(TcpListener::Open("127.0.0.1", 0, &l).ok());
  std::vector<TcpPeer> two = {{l->address(), "h0"}, {"127.0.0.1:1", "h1"}};
  s = ConnectTcpWorld(0, two, std::move(l), quick, &w);
  CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "rank(s) 1"));
  CHECK(s.cause() == FailureCause::TIMEOUT);
  // And a rank that cannot reach a lower one names it, its host and address.
  CHECK(TcpListener::Open("127.0.0.1", 0, &l).ok());
  two = {{"127.0.0.1:1", "h0"}, {l->address(), "h1"}};
  s = ConnectTcpWorld(1, two, std::move(l), quick, &w);
  CHECK(s.code() == StatusCode::ABORTED &&
        Contains(s.message(), "could not connect to rank 0 (host h0, 127.0.0.1:1)"));
  CHECK(s.cause() == FailureCause::PEER_FAILURE && s.rank() == 0);
  CHECK(w == nullptr);
}

}  // namespace

int main() {
  signal(SIGPIPE, SIG_IGN);
  TestInProcess();
  return CheckExitCode();
}
