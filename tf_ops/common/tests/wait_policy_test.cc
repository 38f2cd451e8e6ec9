// Tests of Communicator::Wait's choice between spinning and blocking
// (transport/communicator.cc), whatever the transport: the back-off after
// spins in vain, urgent and idle waits, a transport that cannot block, and
// waits that never spin when the ranks on this host outnumber its CPUs (the
// peer monitor's count). Built and run under ASan/UBSan by
// tests/common/transport/test_tcp_communicator.py (and by Bazel as
// //tf_ops:wait_policy_test).
#include <unistd.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "../peer_monitor.h"
#include "../transport/communicator.h"
#include "check.h"

using namespace tfring;

namespace {

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

}  // namespace

int main() {
  TestWaitPolicy();
  return CheckExitCode();
}
