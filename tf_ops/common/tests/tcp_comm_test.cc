// Tests of the TCP communicator (transport/tcp/tcp_communicator.*), built and
// run under ASan/UBSan by tests/common/transport/test_tcp_communicator.py.
//   tcp_comm_test                 in-process tests: worlds of 2 and 3 ranks on
//                                 threads over real loopback sockets (there is
//                                 no global state, so several worlds, one
//                                 after another, live in one process)
//   tcp_comm_test rank R N DIR SCENARIO [HEARTBEAT_S]
//                                 one rank of a multi-process job: publishes
//                                 its listener in DIR/addr.R, reads the others'
//                                 (secret from TFRING_SECRET), runs SCENARIO:
//     exchange   point-to-point and the collectives; prints "RESULT ok"
//     ring       exchanges 1 MiB around a ring until the world fails; prints
//                "READY" once connected, "EXCHANGING" after its first
//                exchange, and "ABORTED <message>" at the end
//     serve      ranks > 0 wait for DIR/go before connecting; then prints
//                "READY", keeps exchanging until DIR/stop exists,
//                checks every message, prints "RESULT ok"
//     pingpong   ranks 0 and 1 bounce 4 KB; prints "PINGPONG <us per round trip>"
//     bandwidth  ranks 0 and 1 swap 64 MiB ten times; prints "BANDWIDTH <GB/s>"
//     idle       sits idle 5 s; prints "IDLECPU <CPU s per s>"
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../transport/tcp/peer_frame.h"
#include "../transport/tcp/socket.h"
#include "../transport/tcp/tcp_communicator.h"
#include "../transport/tcp/wire.h"
#include "check.h"

using namespace tfring;
using namespace tfring::tcp;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  uint32_t x = 2166136261u ^ uint32_t(seed * 7919 + int(n));
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = char(x >> 24);
  }
  return s;
}

Status SendRecv(Communicator& c, const std::string& out, int to, std::string* in, int from,
                int tag) {
  std::vector<CommRequestPtr> reqs(2);
  TFRING_RETURN_IF_ERROR(c.Irecv(&(*in)[0], int64_t(in->size()), from, tag, &reqs[0]));
  TFRING_RETURN_IF_ERROR(c.Isend(out.data(), int64_t(out.size()), to, tag, &reqs[1]));
  return c.WaitAll(&reqs, "test exchange", true);
}

Status Send(Communicator& c, const std::string& out, int to, int tag) {
  CommRequestPtr r;
  TFRING_RETURN_IF_ERROR(c.Isend(out.data(), int64_t(out.size()), to, tag, &r));
  return c.Wait(r.get(), "test send", false);
}

Status Recv(Communicator& c, std::string* in, int from, int tag) {
  CommRequestPtr r;
  TFRING_RETURN_IF_ERROR(c.Irecv(&(*in)[0], int64_t(in->size()), from, tag, &r));
  return c.Wait(r.get(), "test receive", false);
}

void Sleep(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// ---------------------------------------------------------------------------
// Scenarios: each runs on every rank of a world.

void P2PSizes(Communicator& c) {
  const int n = c.size(), r = c.rank();
  const size_t sizes[] = {0, 1, 7, 4096, 65535, 65536, 1 << 20, (17u << 20) + 3};
  for (size_t sz : sizes) {
    std::string out = Pattern(sz, r), in(sz, 'x');
    Status s = SendRecv(c, out, (r + 1) % n, &in, (r + n - 1) % n, 11);
    CHECK(s.ok());
    CHECK(in == Pattern(sz, (r + n - 1) % n));
  }
}

void FifoAndUnexpected(Communicator& c) {
  if (c.size() < 2 || c.rank() > 1) return;
  const int kMsgs = 40;
  if (c.rank() == 0) {
    std::vector<std::string> bufs;
    for (int i = 0; i < kMsgs; ++i) bufs.push_back(Pattern(100 + 997 * i, i));
    std::vector<CommRequestPtr> reqs(kMsgs);
    for (int i = 0; i < kMsgs; ++i) {
      CHECK(c.Isend(bufs[i].data(), int64_t(bufs[i].size()), 1, 5, &reqs[i]).ok());
    }
    CHECK(c.WaitAll(&reqs, "fifo", false).ok());
    // Interleaved tags: A(1) B(2) C(1); a large unexpected one (tag 3)
    // arrives while nothing is posted for it.
    CHECK(Send(c, "A", 1, 1).ok());
    CHECK(Send(c, "B", 1, 2).ok());
    CHECK(Send(c, "C", 1, 1).ok());
    std::string big = Pattern(20u << 20, 3);
    CHECK(Send(c, big, 1, 3).ok());
    // A size mismatch: 100 bytes against a posted 50.
    CHECK(Send(c, std::string(100, 'm'), 1, 9).ok());
    CHECK(Send(c, "after", 1, 9).ok());
  } else {
    Sleep(0.3);  // everything above is unexpected by now (or arriving)
    for (int i = 0; i < kMsgs; ++i) {
      std::string in(100 + 997 * i, 'x');
      CHECK(Recv(c, &in, 0, 5).ok());
      CHECK(in == Pattern(100 + 997 * i, i));
    }
    std::string one(1, 'x');
    CHECK(Recv(c, &one, 0, 2).ok() && one == "B");
    CHECK(Recv(c, &one, 0, 1).ok() && one == "A");
    CHECK(Recv(c, &one, 0, 1).ok() && one == "C");
    std::string big(20u << 20, 'x');
    CHECK(Recv(c, &big, 0, 3).ok());
    CHECK(big == Pattern(20u << 20, 3));
    std::string half(50, 'x');
    Status s = Recv(c, &half, 0, 9);
    CHECK(!s.ok() && Contains(s.message(), "100 bytes") && Contains(s.message(), "50 bytes"));
    CHECK(Contains(s.message(), "rank 0") && Contains(s.message(), "tag 9"));
    std::string after(5, 'x');
    CHECK(Recv(c, &after, 0, 9).ok() && after == "after");
  }
}

// Large messages that arrive before their receive is posted wait in the
// kernel (world.h, kMaxHold). Every way out of that wait must
// deliver the right bytes in order: a receive for a message behind the held
// one (it is buffered so the later one can be reached), the hold outlasting
// its bound (when the heartbeat thread reads the header during the sleep),
// the matching receive, and a matching receive of the wrong size
// (an error; the stream goes on).
void HeldFrames(Communicator& c) {
  if (c.size() < 2 || c.rank() > 1) return;
  const size_t kBig = 1u << 20;
  if (c.rank() == 0) {
    std::vector<std::string> out = {Pattern(kBig, 31), "small", Pattern(kBig, 33),
                                    Pattern(kBig / 4, 34), Pattern(kBig / 2, 35), "end"};
    std::vector<CommRequestPtr> reqs(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      CHECK(c.Isend(out[i].data(), int64_t(out[i].size()), 1, int(31 + i), &reqs[i]).ok());
    }
    CHECK(c.WaitAll(&reqs, "held frames", false).ok());
    return;
  }
  Sleep(0.05);  // the first large message's header is in by the first Test
  std::string small(5, 'x');
  CHECK(Recv(c, &small, 0, 32).ok() && small == "small");
  std::string in(kBig, 'x');
  CHECK(Recv(c, &in, 0, 31).ok() && in == Pattern(kBig, 31));
  Sleep(0.3);  // longer than a hold lasts
  CHECK(Recv(c, &in, 0, 33).ok() && in == Pattern(kBig, 33));
  std::string quarter(kBig / 4, 'x');
  CHECK(Recv(c, &quarter, 0, 34).ok() && quarter == Pattern(kBig / 4, 34));
  std::string wrong(kBig / 2 + 8, 'x');
  Status s = Recv(c, &wrong, 0, 35);
  CHECK(!s.ok() && Contains(s.message(), std::to_string(kBig / 2) + " bytes"));
  std::string end(3, 'x');
  CHECK(Recv(c, &end, 0, 36).ok() && end == "end");
}

void CancelledReceive(Communicator& c) {
  if (c.size() < 2 || c.rank() > 1) return;
  if (c.rank() == 1) {
    std::string lost(4, 'x');
    CommRequestPtr r;
    CHECK(c.Irecv(&lost[0], 4, 0, 21, &r).ok());
    c.Cancel(&r);
    CHECK(r == nullptr);
    CHECK(Send(c, "go", 0, 22).ok());
    std::string in(4, 'x');
    CHECK(Recv(c, &in, 0, 21).ok() && in == "msg1");
    CHECK(lost == "xxxx");  // the cancelled receive took nothing
  } else {
    std::string go(2, 'x');
    CHECK(Recv(c, &go, 1, 22).ok());
    CHECK(Send(c, "msg1", 1, 21).ok());
  }
}

void SelfAndBadArgs(Communicator& c) {
  std::string in(3, 'x');
  CommRequestPtr rr, sr;
  CHECK(c.Isend("abc", 3, c.rank(), 4, &sr).ok());
  CHECK(c.Irecv(&in[0], 3, c.rank(), 4, &rr).ok());
  CHECK(c.Wait(sr.get(), "self", false).ok() && c.Wait(rr.get(), "self", false).ok());
  CHECK(in == "abc");
  CommRequestPtr bad;
  Status s = c.Isend("a", 1, c.size(), 0, &bad);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "rank"));
  s = c.Irecv(&in[0], 1, 0, -3, &bad);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "tag"));
  CHECK(c.max_tag() >= 32767);
  CHECK(std::string(c.transport()) == "TCP");
}

void Collectives(Communicator& c) {
  const int n = c.size(), r = c.rank();
  std::vector<std::string> all;
  std::string mine = r == 1 ? std::string() : Pattern(10 + 1000 * r, r);
  CHECK(GatherBytes(c, mine, &all).ok());
  if (r == 0) {
    CHECK(int(all.size()) == n);
    for (int i = 0; i < n && int(all.size()) == n; ++i) {
      CHECK(all[i] == (i == 1 ? std::string() : Pattern(10 + 1000 * i, i)));
    }
  }
  std::string b = r == 0 ? Pattern(300000, 42) : std::string("stale");
  CHECK(BroadcastBytes(c, &b).ok());
  CHECK(b == Pattern(300000, 42));
  std::vector<uint64_t> words = {~uint64_t(0), ~(uint64_t(1) << r), uint64_t(0xff) << r};
  CHECK(AllreduceBitsAnd(c, &words).ok());
  uint64_t expect1 = ~uint64_t(0), expect2 = ~uint64_t(0);
  for (int i = 0; i < n; ++i) {
    expect1 &= ~(uint64_t(1) << i);
    expect2 &= uint64_t(0xff) << i;
  }
  CHECK(words[0] == ~uint64_t(0) && words[1] == expect1 && words[2] == expect2);
  bool all_ok = true;
  CHECK(AgreeAll(c, r != n - 1, &all_ok).ok());
  CHECK(!all_ok);
  CHECK(AgreeAll(c, true, &all_ok).ok());
  CHECK(all_ok);
  CHECK(BarrierP2P(c).ok());
}

void SplitAndDup(Communicator& c) {
  const int n = c.size(), r = c.rank();
  // Ranks 0 and 2 (and 4...) form one group in reverse order; odd ranks
  // another, except rank 1 of a 3-rank world, which opts out.
  int color = r % 2;
  if (n == 3 && r == 1) color = -1;
  std::shared_ptr<Communicator> sub;
  CHECK(c.Split(color, -r, &sub).ok());
  if (color < 0) {
    CHECK(sub == nullptr);
  } else if (sub) {
    int members = 0;
    for (int i = 0; i < n; ++i) members += (i % 2 == color && !(n == 3 && i == 1)) ? 1 : 0;
    CHECK(sub->size() == members);
    int higher = 0;  // key -rank: higher world ranks come first
    for (int i = r + 1; i < n; ++i) higher += (i % 2 == color) ? 1 : 0;
    CHECK(sub->rank() == higher);
    // The same tag on the sub-communicator and the world never cross.
    if (sub->size() > 1) {
      int m = sub->size(), me = sub->rank();
      std::string in(16, 'x');
      CHECK(SendRecv(*sub, Pattern(16, 100 + r), (me + 1) % m, &in, (me + m - 1) % m, 11).ok());
      Collectives(*sub);
    }
  }
  // Dup: rank 0 sends on the dup first, then the world; rank 1 receives the
  // world's first and must get the world's message.
  std::shared_ptr<Communicator> dup;
  CHECK(c.Dup(&dup).ok());
  CHECK(dup && dup->size() == n && dup->rank() == r);
  if (dup && r == 0) {
    CHECK(Send(*dup, "dup!", 1, 7).ok());
    CHECK(Send(c, "wld!", 1, 7).ok());
  } else if (dup && r == 1) {
    Sleep(0.1);
    std::string in(4, 'x');
    CHECK(Recv(c, &in, 0, 7).ok() && in == "wld!");
    CHECK(Recv(*dup, &in, 0, 7).ok() && in == "dup!");
  }
  if (dup) CHECK(BarrierP2P(*dup).ok());
  // Splits of splits agree on their contexts too.
  std::shared_ptr<Communicator> all1, all2;
  CHECK(c.Split(0, r, &all1).ok() && all1);
  if (all1) {
    CHECK(all1->Split(0, r, &all2).ok() && all2);
    if (all2) Collectives(*all2);
  }
}

void Exchange(Communicator& c) {
  P2PSizes(c);
  FifoAndUnexpected(c);
  HeldFrames(c);
  CancelledReceive(c);
  SelfAndBadArgs(c);
  Collectives(c);
  SplitAndDup(c);
  CHECK(BarrierP2P(c).ok());
}

// ---------------------------------------------------------------------------
// In-process worlds: one thread per rank.

void RunThreads(int n, const TcpOptions& options,
                const std::function<void(int, std::shared_ptr<Communicator>&)>& body) {
  std::vector<std::unique_ptr<TcpListener>> listeners(n);
  std::vector<TcpPeer> peers(n);
  for (int i = 0; i < n; ++i) {
    Status s = TcpListener::Open("127.0.0.1", 0, &listeners[i]);
    CHECK(s.ok());
    if (!s.ok()) return;
    peers[i].addr = listeners[i]->address();
    peers[i].host = "thread-host-" + std::to_string(i);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      std::shared_ptr<Communicator> world;
      Status s = ConnectTcpWorld(i, peers, std::move(listeners[i]), options, &world);
      CHECK(s.ok());
      if (!s.ok()) {
        std::fprintf(stderr, "connect: %s\n", s.message().c_str());
        return;
      }
      body(i, world);
    });
  }
  for (auto& t : threads) t.join();
}

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

// Communicator::Wait's choice between spinning and blocking (communicator.cc),
// on a scripted transport: each request says at which Test it completes, or
// that it completes only once the wait has blocked, and Block() records at
// which Test it was called. Everything asserted depends on counts, not on
// the clock: a spinning wait reads the clock only from its 8th Test on, so
// "blocked at the 2nd Test" means it did not spin.
class ScriptedComm : public Communicator {
 public:
  struct Req : CommRequest {
    int done_at = 0;          // completes at this Test (1-based); 0: only after a Block
    int tests = 0;
    int blocked_at = 0;       // the Test count when Block was first called
    bool after_block = false;
  };
  explicit ScriptedComm(bool can_block) : can_block_(can_block) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* transport() const override { return "scripted"; }
  Status Isend(const void*, int64_t, int, int, CommRequestPtr*) override { return Status::OK(); }
  Status Irecv(void*, int64_t, int, int, CommRequestPtr*) override { return Status::OK(); }
  Status Test(CommRequest* req, bool* done) override {
    auto* r = static_cast<Req*>(req);
    ++r->tests;
    *done = r->done_at > 0 ? r->tests >= r->done_at : r->after_block;
    return Status::OK();
  }
  void Cancel(CommRequestPtr* req) override { req->reset(); }
  Status Split(int, int, std::shared_ptr<Communicator>*) override { return Status::OK(); }
  Status Dup(std::shared_ptr<Communicator>*) override { return Status::OK(); }
  bool Block(CommRequest* req, int) override {
    auto* r = static_cast<Req*>(req);
    if (r->blocked_at == 0) r->blocked_at = r->tests;
    if (!can_block_) return false;
    // A blocked wait lasts long: the reply was not coming within the spin.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    r->after_block = true;
    return true;
  }

 private:
  bool can_block_;
};

// One wait on a request that completes at Test `done_at` (0: after a Block);
// returns the Test count at the first Block (0: never blocked).
int ScriptedWait(Communicator& c, int done_at, bool spin) {
  ScriptedComm::Req r;
  r.done_at = done_at;
  CHECK(c.Wait(&r, "scripted", spin).ok());
  return r.blocked_at;
}

void WaitPolicyOnThisThread() {
  ScriptedComm comm(true);
  SetUrgentWaits(false);
  // A data wait whose reply comes during the spin never blocks.
  CHECK(ScriptedWait(comm, 2, true) == 0);
  CHECK(ScriptedWait(comm, 30, true) == 0);
  // One that spins in vain blocks, after at least 8 Tests (the clock is read
  // from the 8th on, and the spin lasts kSpinBeforeBlock = 100 us)...
  CHECK(ScriptedWait(comm, 0, true) >= 8);
  // ...and the next 4 waits that must wait do not spin: they block at their
  // 2nd Test. A request done at the first Test does not count.
  for (int i = 0; i < 4; ++i) {
    CHECK(ScriptedWait(comm, 1, true) == 0);
    CHECK(ScriptedWait(comm, 0, true) == 2);
  }
  // Then it spins again; failing again doubles the back-off to 8 waits.
  CHECK(ScriptedWait(comm, 0, true) >= 8);
  for (int i = 0; i < 8; ++i) CHECK(ScriptedWait(comm, 0, true) == 2);
  // A spin that pays off resets the back-off: one failure skips 4 again.
  CHECK(ScriptedWait(comm, 3, true) == 0);
  CHECK(ScriptedWait(comm, 0, true) >= 8);
  for (int i = 0; i < 4; ++i) CHECK(ScriptedWait(comm, 0, true) == 2);
  CHECK(ScriptedWait(comm, 3, true) == 0);
  // An idle wait (not spin, not urgent) never spins; an urgent one spins
  // like a data wait.
  CHECK(ScriptedWait(comm, 0, false) == 2);
  SetUrgentWaits(true);
  CHECK(ScriptedWait(comm, 5, false) == 0);
  // Data waits that spin in vain do not stop the negotiation's (urgent)
  // waits from spinning, nor the other way round.
  CHECK(ScriptedWait(comm, 0, true) >= 8);
  CHECK(ScriptedWait(comm, 0, true) == 2);
  CHECK(ScriptedWait(comm, 5, false) == 0);
  CHECK(ScriptedWait(comm, 0, false) >= 8);
  CHECK(ScriptedWait(comm, 0, false) == 2);
  CHECK(ScriptedWait(comm, 0, true) == 2);  // still backing off from before
  SetUrgentWaits(false);
  // A transport that cannot block (MPI) keeps polling until done.
  ScriptedComm polling(false);
  ScriptedComm::Req r;
  r.done_at = 500;
  CHECK(polling.Wait(&r, "scripted", true).ok());
  CHECK(r.tests == 500);
}

// `peers` more ranks of this process's pid on this host: with as many peers
// as this process may use CPUs, the ranks outnumber the CPUs.
std::shared_ptr<PeerMonitor> MonitorWithPeers(int peers) {
  std::vector<PeerMonitor::Peer> list;
  for (int i = 1; i <= peers; ++i) list.push_back({i, int(getpid()), "this-host"});
  return std::make_shared<PeerMonitor>(0, "this-host", list);
}

void OutnumberedWaitsOnThisThread() {
  const int cpus = PeerMonitor::CpusOf({0});
  CHECK(cpus >= 1);
  // The union of masks: the same process twice, or one that does not
  // exist, adds no CPU.
  CHECK(PeerMonitor::CpusOf({0, int(getpid())}) == cpus);
  CHECK(PeerMonitor::CpusOf({0, 0x3ffffffe}) == cpus);
  CHECK(!MonitorWithPeers(cpus - 1)->outnumbered());
  CHECK(MonitorWithPeers(cpus)->outnumbered());
  CHECK(MonitorWithPeers(cpus + 2)->outnumbered());

  ScriptedComm comm(true);
  SetUrgentWaits(true);
  // Ranks outnumber CPUs: data and urgent waits block at their 2nd Test,
  // every time, without first learning it from a failed spin.
  comm.set_monitor(MonitorWithPeers(cpus));
  for (int i = 0; i < 20; ++i) {
    CHECK(ScriptedWait(comm, 0, true) == 2);
    CHECK(ScriptedWait(comm, 0, false) == 2);
    CHECK(ScriptedWait(comm, 5, true) == 2);
  }
  // They leave the spin history alone: as many ranks as CPUs spin again at
  // once, as a fresh thread does.
  comm.set_monitor(MonitorWithPeers(cpus - 1));
  CHECK(ScriptedWait(comm, 4, true) == 0);
  CHECK(ScriptedWait(comm, 0, true) >= 8);
  CHECK(ScriptedWait(comm, 0, false) >= 8);
  SetUrgentWaits(false);
}

void TestWaitPolicy() {
  // The spin state is per thread: a fresh thread starts from no history.
  std::thread t(WaitPolicyOnThisThread);
  t.join();
  std::thread u(OutnumberedWaitsOnThisThread);
  u.join();
}

void TestHeaderParser() {
  uint8_t b[kPeerHeaderBytes];
  PeerHeader h, g;
  h.kind = PeerFrameKind::DATA;
  h.tag = -1;
  h.context = 0x0123456789abcdefull;
  h.length = (uint64_t(1) << 40);
  EncodePeerHeader(h, b);
  CHECK(ParsePeerHeader(b, &g).ok());
  CHECK(g.kind == h.kind && g.tag == -1 && g.context == h.context && g.length == h.length);
  b[23] = 1;  // above the limit
  CHECK(ParsePeerHeader(b, &g).cause() == WireCause::PROTOCOL_ERROR);
  EncodePeerHeader(h, b);
  b[0] = 9;
  CHECK(Contains(ParsePeerHeader(b, &g).message(), "unknown frame kind 9"));
  EncodePeerHeader(h, b);
  b[2] = 1;
  CHECK(!ParsePeerHeader(b, &g).ok());
  h.kind = PeerFrameKind::HEARTBEAT;
  h.length = 5;
  EncodePeerHeader(h, b);
  CHECK(Contains(ParsePeerHeader(b, &g).message(), "payload"));
  Hello hello;
  hello.client_rank = 2;
  hello.server_rank = 1;
  hello.size = 3;
  FrameParser p(kMaxHandshakeFrame);
  std::string f = EncodeHello(hello) + EncodeHelloOk(1);
  p.Feed(reinterpret_cast<const uint8_t*>(f.data()), f.size());
  Frame fr;
  bool have = false;
  Hello back;
  uint32_t rank = 0;
  CHECK(p.Next(&fr, &have).ok() && have && ParseHello(fr, &back).ok());
  CHECK(back.client_rank == 2 && back.server_rank == 1 && back.size == 3);
  CHECK(p.Next(&fr, &have).ok() && have && ParseHelloOk(fr, &rank).ok() && rank == 1);
}

// ---------------------------------------------------------------------------
// One rank of a multi-process job.

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

int RankMain(int rank, int n, const std::string& dir, const std::string& scenario, double hb) {
  std::string secret;
  const char* hex = std::getenv("TFRING_SECRET");
  WireStatus ws = DecodeSecretHex(hex ? hex : "", &secret);
  if (!ws.ok()) {
    std::printf("ERROR %s\n", ws.message().c_str());
    return 2;
  }
  std::unique_ptr<TcpListener> l;
  Status s = TcpListener::Open("127.0.0.1", 0, &l);
  if (!s.ok()) {
    std::printf("ERROR %s\n", s.message().c_str());
    return 2;
  }
  {
    std::string tmp = dir + "/.addr." + std::to_string(rank);
    std::ofstream(tmp) << l->address();
    std::rename(tmp.c_str(), (dir + "/addr." + std::to_string(rank)).c_str());
  }
  std::vector<TcpPeer> peers(n);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < n; ++i) {
    while (!ReadFile(dir + "/addr." + std::to_string(i), &peers[i].addr)) {
      if (std::chrono::steady_clock::now() > until) {
        std::printf("ERROR no address from rank %d\n", i);
        return 2;
      }
      Sleep(0.02);
    }
    peers[i].host = "proc-host-" + std::to_string(i);
  }
  // "serve": the other ranks hold back until DIR/go exists, so the test
  // knows rank 0 is in the middle of start-up while strangers knock.
  std::string go;
  while (scenario == "serve" && rank > 0 && !ReadFile(dir + "/go", &go)) {
    if (std::chrono::steady_clock::now() > until) {
      std::printf("ERROR no go\n");
      return 2;
    }
    Sleep(0.02);
  }
  TcpOptions options;
  options.secret = secret;
  options.heartbeat_seconds = hb;
  options.connect_timeout = 60;
  std::shared_ptr<Communicator> world;
  s = ConnectTcpWorld(rank, peers, std::move(l), options, &world);
  if (!s.ok()) {
    std::printf("ERROR %s\n", s.message().c_str());
    return 2;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  if (scenario == "exchange") {
    Exchange(*world);
  } else if (scenario == "ring") {
    const size_t kBytes = 1 << 20;
    std::string out = Pattern(kBytes, rank), in(kBytes, 'x');
    for (int i = 0;; ++i) {
      s = SendRecv(*world, out, (rank + 1) % n, &in, (rank + n - 1) % n, 1);
      if (!s.ok()) break;
      if (i == 0) {
        std::printf("EXCHANGING\n");
        std::fflush(stdout);
      }
    }
    std::printf("ABORTED %s\n", s.message().c_str());
    std::fflush(stdout);
    CHECK(s.code() == StatusCode::ABORTED);
  } else if (scenario == "serve") {
    std::string stop;
    for (int i = 0; !ReadFile(dir + "/stop", &stop); ++i) {
      std::vector<uint64_t> words = {uint64_t(i)};
      CHECK(AllreduceBitsAnd(*world, &words).ok());
      CHECK(words[0] == uint64_t(i));
      std::string b = rank == 0 ? Pattern(5000, i) : std::string();
      CHECK(BroadcastBytes(*world, &b).ok());
      CHECK(b == Pattern(5000, i));
      Sleep(0.02);
    }
    CHECK(BarrierP2P(*world).ok());
  } else if (scenario == "pingpong") {
    const int kIters = 5000;
    std::string buf(4096, 'p');
    CHECK(BarrierP2P(*world).ok());
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters && rank < 2; ++i) {
      if (rank == 0) {
        CommRequestPtr r;
        CHECK(world->Isend(buf.data(), 4096, 1, 2, &r).ok());
        CHECK(world->Wait(r.get(), "ping", true).ok());
        CHECK(world->Irecv(&buf[0], 4096, 1, 2, &r).ok());
        CHECK(world->Wait(r.get(), "pong", true).ok());
      } else {
        CommRequestPtr r;
        CHECK(world->Irecv(&buf[0], 4096, 0, 2, &r).ok());
        CHECK(world->Wait(r.get(), "ping", true).ok());
        CHECK(world->Isend(buf.data(), 4096, 0, 2, &r).ok());
        CHECK(world->Wait(r.get(), "pong", true).ok());
      }
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                    .count() / kIters;
    if (rank == 0) std::printf("PINGPONG %.1f\n", us);
    CHECK(BarrierP2P(*world).ok());
  } else if (scenario == "bandwidth") {
    // Ranks 0 and 1 swap 64 MiB ten times, checking the last exchange.
    const size_t kBytes = 64u << 20;
    std::string out = Pattern(kBytes, rank), in(kBytes, 'x');
    CHECK(BarrierP2P(*world).ok());
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10 && rank < 2; ++i) {
      CHECK(SendRecv(*world, out, 1 - rank, &in, 1 - rank, 3).ok());
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank < 2) CHECK(in == Pattern(kBytes, 1 - rank));
    if (rank == 0) std::printf("BANDWIDTH %.2f GB/s each way\n", 10 * kBytes / s / 1e9);
    CHECK(BarrierP2P(*world).ok());
  } else if (scenario == "idle") {
    // An idle world: only the heartbeat thread runs. Prints the CPU seconds
    // per second this process used meanwhile.
    CHECK(BarrierP2P(*world).ok());
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    auto t0 = std::chrono::steady_clock::now();
    Sleep(5.0);
    getrusage(RUSAGE_SELF, &b);
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto secs = [](const struct timeval& t) { return double(t.tv_sec) + t.tv_usec * 1e-6; };
    double cpu = secs(b.ru_utime) - secs(a.ru_utime) + secs(b.ru_stime) - secs(a.ru_stime);
    std::printf("IDLECPU %.4f\n", cpu / wall);
    CHECK(BarrierP2P(*world).ok());
  } else {
    std::printf("ERROR unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  world.reset();
  if (g_failures == 0) std::printf("RESULT ok\n");
  return CheckExitCode();
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 6 && std::string(argv[1]) == "rank") {
    return RankMain(std::atoi(argv[2]), std::atoi(argv[3]), argv[4], argv[5],
                    argc > 6 ? std::atof(argv[6]) : 1.0);
  }
  TestHeaderParser();
  TestWaitPolicy();
  TestInProcess();
  return CheckExitCode();
}
