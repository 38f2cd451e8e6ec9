#include "communicator.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

namespace tfring {

namespace {
std::atomic<bool> g_urgent_waits{false};

// How long a wait that matters spins before it blocks on a transport that
// can block. Waking from poll() costs ~30 us per hop on the development VM
// (a 40-byte TCP ping-pong over loopback: 10 us round trip spinning, 72 us
// blocking), which is most of a negotiation round; a reply that comes
// within this is taken without that cost. Longer would cost a spinning
// rank's CPU for no gain: a reply that is later than this is usually late
// by much more (a peer still computing, or waiting for the core we spin on).
constexpr auto kSpinBeforeBlock = std::chrono::microseconds(100);
// Spinning is a bet that the peer answers within kSpinBeforeBlock, which
// holds while every rank has a core to itself and fails when ranks
// outnumber cores (the spinner then takes the core of the rank it waits
// for: at np=3 on 2 cores a negotiation round got 2-4x slower). So a wait
// spins only while recent spins paid off: one that spun in vain turns
// spinning off for the next kSpinBackoffMin waits, doubling up to
// kSpinBackoffMax after each further failure, and a spin that catches its
// reply resets the back-off. The state is per thread (waits come from the
// core's background thread, and tests' threads, each with its own peers)
// and per kind of wait: data waits (a ring's pieces, which over TCP across
// hosts arrive a millisecond apart and rarely within a spin) must not turn
// off the spin of the negotiation's waits, which are answered within
// microseconds while the ranks run in step.
// Where it is known beforehand that the bet fails, because this host's
// ranks outnumber the CPUs they may run on (PeerMonitor::outnumbered()),
// waits do not spin at all: learning it from failed spins lets every few
// waits spin in vain again, and at np=3 on 2 cores some runs never settled
// (benchmarks/RESULTS_TRANSPORT.md, session 4).
constexpr int kSpinBackoffMin = 4;
constexpr int kSpinBackoffMax = 1024;
struct SpinState {
  int skip = 0;                     // waits left that do not spin
  int backoff = kSpinBackoffMin;    // the next failure's `skip`
};
thread_local SpinState t_spin_state[2];  // [spin]: negotiation, data

// Tags of the point-to-point collectives below.
constexpr int kGatherLenTag = kCollectiveTagBase + 2;
constexpr int kGatherTag = kCollectiveTagBase + 3;
constexpr int kBcastLenTag = kCollectiveTagBase + 4;
constexpr int kBcastTag = kCollectiveTagBase + 5;
constexpr int kBitsTag = kCollectiveTagBase + 6;
constexpr int kBitsResultTag = kCollectiveTagBase + 7;
}  // namespace

void SetUrgentWaits(bool urgent) { g_urgent_waits.store(urgent, std::memory_order_relaxed); }
bool UrgentWaits() { return g_urgent_waits.load(std::memory_order_relaxed); }

Status Communicator::Wait(CommRequest* req, const char* what, bool spin) {
  if (req == nullptr) return Status::OK();
  const bool outnumbered = monitor_ && monitor_->outnumbered();
  bool done = false;
  auto sleep = std::chrono::microseconds(10);
  const bool urgent = UrgentWaits();
  const auto cap = urgent ? std::chrono::microseconds(100) : std::chrono::microseconds(1000);
  const int eager_polls = urgent ? 2000 : 200;
  const bool matters = spin || urgent;
  SpinState& t_spin = t_spin_state[spin ? 1 : 0];
  // A wait that matters spins a little before it blocks (see
  // kSpinBeforeBlock), unless recent spins were in vain; an idle one polls
  // once and blocks. Decided at the second poll: a request done at the first
  // (a send the kernel took at once) says nothing about the peer.
  bool spin_first = false;
  std::chrono::steady_clock::time_point start;
  // Bounds a blocked wait, so the peer monitor is consulted and a peer that
  // went silent is noticed even when no byte arrives.
  const int block_ms = matters ? 5 : 20;
  bool can_block = true;
  bool blocked = false;
  for (int polls = 0;; ++polls) {
    Status s = Test(req, &done);
    if (!s.ok()) {
      // The transport names the peer and the cause; the caller names the step.
      if (s.code() != StatusCode::ABORTED || what == nullptr || what[0] == '\0') return s;
      return s.WithMessage(s.message() + " (while waiting for " + what + ")");
    }
    if (done) {
      if (spin_first && can_block) {
        if (!blocked) {
          t_spin.backoff = kSpinBackoffMin;  // the spin paid off
        } else {
          t_spin.skip = t_spin.backoff;
          t_spin.backoff = std::min(kSpinBackoffMax, 2 * t_spin.backoff);
        }
      }
      return Status::OK();
    }
    if (polls == 0 && matters && !outnumbered) {
      spin_first = t_spin.skip == 0;
      if (!spin_first) --t_spin.skip;
      start = std::chrono::steady_clock::now();
    }
    bool blocking = false;
    if (can_block) {
      if (!spin_first || blocked) {
        blocking = polls >= 1;
      } else if ((polls & 7) == 7) {
        // The clock is read every few polls only: a Test is a system call
        // (~1 us), the clock is cheaper but not free.
        blocking = std::chrono::steady_clock::now() - start >= kSpinBeforeBlock;
      }
    }
    if (monitor_ && (blocking || (polls & 63) == 63)) {
      TFRING_RETURN_IF_ERROR(monitor_->Check());
    }
    if (blocking) {
      can_block = Block(req, block_ms);
      blocked = blocked || can_block;
      if (can_block) continue;
    }
    // Even a spinning wait lets others run now and then: with more ranks than
    // cores, the peer it waits for may need this core.
    if (spin && polls >= 64) sched_yield();
    if (!spin && polls >= eager_polls) {
      std::this_thread::sleep_for(sleep);
      if (sleep < cap) sleep *= 2;
    } else if (!spin && polls >= 200) {
      sched_yield();
    }
  }
}

Status Communicator::WaitAll(std::vector<CommRequestPtr>* reqs, const char* what, bool spin) {
  Status result;
  for (auto& r : *reqs) {
    if (!r) continue;
    if (result.ok()) {
      result = Wait(r.get(), what, spin);
      if (result.ok()) {
        r.reset();
        continue;
      }
    }
    Cancel(&r);
  }
  reqs->clear();
  return result;
}

Status AgreeAll(Communicator& comm, bool ok, bool* all_ok) {
  std::vector<uint64_t> word{ok ? 1u : 0u};
  TFRING_RETURN_IF_ERROR(AllreduceBitsAnd(comm, &word));
  *all_ok = word[0] != 0;
  return Status::OK();
}

Status GatherBytes(Communicator& comm, const std::string& mine, std::vector<std::string>* all) {
  const int n = comm.size();
  int64_t len = static_cast<int64_t>(mine.size());
  if (comm.rank() != 0) {
    std::vector<CommRequestPtr> reqs(2);
    TFRING_RETURN_IF_ERROR(comm.Isend(&len, sizeof(len), 0, kGatherLenTag, &reqs[0]));
    TFRING_RETURN_IF_ERROR(comm.Isend(mine.data(), len, 0, kGatherTag, &reqs[1]));
    return comm.WaitAll(&reqs, "gather of requests", false);
  }
  all->assign(n, std::string());
  (*all)[0] = mine;
  std::vector<int64_t> lens(n, 0);
  std::vector<CommRequestPtr> reqs(n);
  for (int r = 1; r < n; ++r) {
    TFRING_RETURN_IF_ERROR(comm.Irecv(&lens[r], sizeof(int64_t), r, kGatherLenTag, &reqs[r]));
  }
  TFRING_RETURN_IF_ERROR(comm.WaitAll(&reqs, "gather of request sizes", false));
  reqs.clear();
  reqs.resize(n);
  for (int r = 1; r < n; ++r) {
    if (lens[r] < 0 || lens[r] > (int64_t{1} << 40)) {
      return Status::Aborted("tfring: rank " + std::to_string(r) +
                             " sent an impossible request size " + std::to_string(lens[r]));
    }
    (*all)[r].resize(lens[r]);
    TFRING_RETURN_IF_ERROR(comm.Irecv(&(*all)[r][0], lens[r], r, kGatherTag, &reqs[r]));
  }
  return comm.WaitAll(&reqs, "gather of requests", false);
}

Status BroadcastBytes(Communicator& comm, std::string* bytes) {
  const int n = comm.size();
  if (comm.rank() == 0) {
    int64_t len = static_cast<int64_t>(bytes->size());
    std::vector<CommRequestPtr> reqs(2 * n);
    for (int r = 1; r < n; ++r) {
      TFRING_RETURN_IF_ERROR(comm.Isend(&len, sizeof(len), r, kBcastLenTag, &reqs[2 * r]));
      TFRING_RETURN_IF_ERROR(comm.Isend(bytes->data(), len, r, kBcastTag, &reqs[2 * r + 1]));
    }
    return comm.WaitAll(&reqs, "broadcast of responses", false);
  }
  int64_t len = 0;
  CommRequestPtr req;
  TFRING_RETURN_IF_ERROR(comm.Irecv(&len, sizeof(len), 0, kBcastLenTag, &req));
  TFRING_RETURN_IF_ERROR(comm.Wait(req.get(), "broadcast of response size", false));
  if (len < 0 || len > (int64_t{1} << 40)) {
    return Status::Aborted("tfring: rank 0 sent an impossible response size " +
                           std::to_string(len));
  }
  bytes->resize(len);
  TFRING_RETURN_IF_ERROR(comm.Irecv(&(*bytes)[0], len, 0, kBcastTag, &req));
  return comm.Wait(req.get(), "broadcast of responses", false);
}

Status AllreduceBitsAnd(Communicator& comm, std::vector<uint64_t>* words) {
  const int n = comm.size();
  const int64_t bytes = static_cast<int64_t>(words->size() * sizeof(uint64_t));
  if (n == 1) return Status::OK();
  if (comm.rank() != 0) {
    CommRequestPtr send, recv;
    TFRING_RETURN_IF_ERROR(comm.Irecv(words->data(), bytes, 0, kBitsResultTag, &recv));
    TFRING_RETURN_IF_ERROR(comm.Isend(words->data(), bytes, 0, kBitsTag, &send));
    // The send reads `words` before the result overwrites it: rank 0 answers
    // only after it has received from every rank.
    std::vector<CommRequestPtr> reqs;
    reqs.push_back(std::move(send));
    reqs.push_back(std::move(recv));
    return comm.WaitAll(&reqs, "allreduce of cache bits", false);
  }
  std::vector<std::vector<uint64_t>> theirs(n, std::vector<uint64_t>(words->size()));
  std::vector<CommRequestPtr> reqs(n);
  for (int r = 1; r < n; ++r) {
    TFRING_RETURN_IF_ERROR(comm.Irecv(theirs[r].data(), bytes, r, kBitsTag, &reqs[r]));
  }
  TFRING_RETURN_IF_ERROR(comm.WaitAll(&reqs, "allreduce of cache bits", false));
  for (int r = 1; r < n; ++r)
    for (size_t i = 0; i < words->size(); ++i) (*words)[i] &= theirs[r][i];
  reqs.clear();
  reqs.resize(n);
  for (int r = 1; r < n; ++r) {
    TFRING_RETURN_IF_ERROR(comm.Isend(words->data(), bytes, r, kBitsResultTag, &reqs[r]));
  }
  return comm.WaitAll(&reqs, "allreduce of cache bits", false);
}

Status BarrierP2P(Communicator& comm) {
  bool ignored = false;
  return AgreeAll(comm, true, &ignored);
}

}  // namespace tfring
