// One POSIX shared-memory segment mapped by every rank of a process set on
// this host, and the step protocol the shared-memory data plane builds on.
//
// Layout (every part aligned so no two ranks write the same cache line):
//   ShmHeader                              the layout, written once by rank 0
//   ShmRankControl  x size                 per-rank step counter, metadata, CPUs
//   slot(rank, parity) x size x 2          data, slot_bytes each, page aligned
//
// Waiting for a peer spins briefly, then yields, then sleeps in a futex on
// the peer's counter (woken by its Publish), checking the peer monitor now
// and then so that a dead peer ends the wait with an error.
//
// The protocol is a sequence of steps, numbered alike on every rank (all
// collectives run in the same order everywhere). In step t each rank
//   1. writes only into its own slot(rank, t % 2),
//   2. Publish(t),
//   3. WaitAll(t): waits until every peer has published t,
//   4. reads any peer's slot(peer, t % 2).
// No other synchronisation is needed: a rank writes slot parity p again at
// step t + 2, and by then it has seen every peer publish t + 1, which each
// peer does only after it finished reading step t. So two slots per rank give
// double buffering: a rank fills its next slot while slower peers still read
// the previous one. By the same argument, in a step where one rank alone
// writes (a broadcast's root), it may fill every rank's slot of that parity.
#ifndef TFRING_COMMON_OPS_SHM_SEGMENT_H
#define TFRING_COMMON_OPS_SHM_SEGMENT_H

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "../peer_monitor.h"
#include "../status.h"
#include "data_plane.h"

namespace tfring {

struct ShmHeader;
struct ShmRankControl;

static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory counters must be lock-free to work across processes");

// Decided by rank 0 and stored in the header, so every rank uses the same
// values even if they were configured differently.
struct ShmLayout {
  int64_t chunk_bytes = 0;            // one rank's share of one step (multiple of 4 KiB)
  int64_t small_allreduce_bytes = 0;  // allreduces up to this size take the one-step path
};

// How a rank waits; local to each rank, correctness does not depend on it.
struct ShmWaitPolicy {
  // Busy-poll this long before yielding the CPU: enough to cover the skew
  // with which ranks usually enter a collective (MPI itself polls forever).
  // Negative: kSpinNs, or kOversubscribedSpinNs when the set's ranks
  // together may run on fewer CPUs than there are ranks.
  int64_t spin_ns = -1;
  int yields = 4;  // then sched_yield() this many times, then sleep in a futex

  static constexpr int64_t kSpinNs = 100000;
  static constexpr int64_t kOversubscribedSpinNs = 2000;
};

class ShmSegment {
 public:
  // Collective over the set's `size` ranks. Rank 0 creates a uniquely named
  // segment sized for `layout` (its value is used; the others adopt rank 0's),
  // broadcasts the name through `bootstrap`, every rank maps it, the ranks
  // agree that all succeeded, and rank 0 unlinks the name. From then on the
  // memory lives exactly as long as some rank maps it, so /dev/shm keeps
  // nothing whichever way the processes end. All ranks return an error
  // together if any rank failed.
  static Status Create(int rank, int size, const ShmLayout& layout, const ShmWaitPolicy& policy,
                       DataPlane* bootstrap, std::shared_ptr<PeerMonitor> monitor,
                       std::unique_ptr<ShmSegment>* out);

  // Marks this rank as gone (waking every sleeper) so that a peer still
  // waiting on it fails instead of hanging, then unmaps.
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const ShmLayout& layout() const { return layout_; }
  int64_t chunk_bytes() const { return layout_.chunk_bytes; }
  // Bytes in one slot: size x chunk_bytes, one chunk-sized place per rank.
  int64_t slot_bytes() const { return slot_bytes_; }
  // CPUs the set's ranks may run on together (the union of their affinity
  // masks), and whether that is fewer than the ranks.
  int cpus() const { return cpus_; }
  bool oversubscribed() const { return cpus_ < size_; }
  int64_t spin_ns() const { return policy_.spin_ns; }

  // The slot `rank` writes during `step`.
  char* slot(int rank, uint32_t step) const;
  // A small value a rank publishes along with its slot for `step` (e.g. how
  // many steps it needs), readable by the peers after WaitAll(step).
  void set_meta(uint32_t step, int64_t value);
  int64_t meta(int rank, uint32_t step) const;

  // Makes this rank's writes for `step` visible and wakes peers sleeping on it.
  void Publish(uint32_t step);
  // Waits until every other rank has published `step`. Fails (ABORTED) when
  // the peer monitor reports a dead peer or a peer has left or given up.
  Status WaitAll(uint32_t step);
  // Tells every peer this rank will not take part any more: a peer waiting
  // for it fails with `reason` instead of waiting forever, and with the
  // cause and failed rank of the failure that made this rank give up.
  // Idempotent.
  void Abandon(const std::string& reason, FailureCause cause, int failed_rank);
  // This rank's job-wide rank (-1: unknown), which a peer's error names when
  // this rank leaves the plane.
  void set_job_rank(int job_rank) { job_rank_ = job_rank; }

 private:
  ShmSegment(int rank, int size, const ShmWaitPolicy& policy,
             std::shared_ptr<PeerMonitor> monitor);
  Status Map(int fd, int64_t bytes);
  Status InitAsCreator(const ShmLayout& layout);
  Status AdoptHeader();
  void PublishCpus();
  void ChooseSpin();
  Status WaitFor(int peer, uint32_t step);
  Status SlowWait(int peer, uint32_t step);
  Status BlockingWait(int peer, uint32_t step);
  Status AbandonedStatus(int peer) const;

  ShmHeader* header() const;
  ShmRankControl* control(int rank) const;

  int rank_, size_;
  ShmWaitPolicy policy_;
  std::shared_ptr<PeerMonitor> monitor_;
  int owner_pid_;  // the process that joined the segment
  int job_rank_ = -1;
  int failed_spins_ = 0;      // full spins in a row that did not see the peer
  int short_spins_left_ = 0;  // waits left that poll only briefly
  ShmLayout layout_;
  int64_t slot_bytes_ = 0;
  int cpus_ = 0;
  int64_t data_offset_ = 0;
  char* base_ = nullptr;
  int64_t mapped_bytes_ = 0;
  bool abandoned_ = false;
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_SHM_SEGMENT_H
