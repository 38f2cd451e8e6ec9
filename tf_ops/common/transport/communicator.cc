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

// Polls (each a Test) before a wait blocks on a transport that can block.
// Long enough to catch a reply already on its way (tens of microseconds),
// short enough not to hold a core that a rank on it is waiting for.
constexpr int kPollsBeforeBlock = 50;

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
  bool done = false;
  auto sleep = std::chrono::microseconds(10);
  const bool urgent = UrgentWaits();
  const auto cap = urgent ? std::chrono::microseconds(100) : std::chrono::microseconds(1000);
  const int eager_polls = urgent ? 2000 : 200;
  // Before blocking, a wait that matters polls a little: a message that
  // arrives within a few microseconds is taken without a sleep and a wake-up.
  const int polls_before_block = spin || urgent ? kPollsBeforeBlock : 1;
  // Bounds a blocked wait, so the peer monitor is consulted and a peer that
  // went silent is noticed even when no byte arrives.
  const int block_ms = spin || urgent ? 5 : 20;
  bool can_block = true;
  for (int polls = 0;; ++polls) {
    Status s = Test(req, &done);
    if (!s.ok()) {
      // The transport names the peer and the cause; the caller names the step.
      if (s.code() != StatusCode::ABORTED || what == nullptr || what[0] == '\0') return s;
      return Status::Aborted(s.message() + " (while waiting for " + what + ")");
    }
    if (done) return Status::OK();
    const bool blocking = can_block && polls >= polls_before_block;
    if (monitor_ && (blocking || (polls & 63) == 63)) {
      TFRING_RETURN_IF_ERROR(monitor_->Check());
    }
    if (blocking) {
      can_block = Block(req, block_ms);
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
