// The seam between the core and a transport. A Communicator is a group of
// ranks that can exchange tagged point-to-point messages without blocking;
// the ring and hierarchical data planes, Adasum and the point-to-point
// controller are written against it, so MPI (mpi/mpi_communicator.h) and
// our own TCP transport (transport/tcp/tcp_communicator.h) are two
// implementations of one contract and nothing above them knows which runs.
//
// Contract:
// - Messages between one pair of ranks with the same tag arrive in the order
//   they were sent; a receive matches exactly (peer, tag) and exactly
//   `bytes` (a different size is an error, not a truncation).
// - Isend/Irecv never block; buffers must stay valid until the request is
//   done or cancelled.
// - Test() reports a dead peer, a broken link or an aborted communicator as
//   an ABORTED status naming the rank, its host and the cause; every later
//   Test() on that communicator fails the same way.
// - Split/Dup are collective over the communicator, called in the same
//   order on every rank, and the result's traffic never matches the
//   parent's.
// - All calls come from one thread at a time (the core's background thread);
//   an implementation may run its own threads (e.g. heartbeats) internally.
#ifndef TFRING_COMMON_TRANSPORT_COMMUNICATOR_H
#define TFRING_COMMON_TRANSPORT_COMMUNICATOR_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../peer_monitor.h"
#include "../status.h"

namespace tfring {

// One non-blocking operation in flight; each transport derives its own.
// Destroying a request that has not completed cancels it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
};
using CommRequestPtr = std::unique_ptr<CommRequest>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "MPI" or "TCP": for messages and the timeline.
  virtual const char* transport() const = 0;

  virtual Status Isend(const void* buf, int64_t bytes, int peer, int tag,
                       CommRequestPtr* out) = 0;
  virtual Status Irecv(void* buf, int64_t bytes, int peer, int tag, CommRequestPtr* out) = 0;
  // Makes progress and sets *done once `req` has completed. A completed or
  // null request stays done.
  virtual Status Test(CommRequest* req, bool* done) = 0;
  // Gives up on `req`; for a receive, no later message lands in its buffer.
  virtual void Cancel(CommRequestPtr* req) = 0;
  // Sleeps until `req` may have progressed (or `timeout_ms` has passed) and
  // makes what progress it can, for a transport whose messages move without
  // being polled (TCP: the kernel buffers them and wakes a sleeper). Returns
  // false when the transport cannot block (MPI progresses only inside Test):
  // the waits below then poll. A wait that blocks leaves the CPU to the
  // ranks it waits for, which matters when ranks outnumber cores.
  virtual bool Block(CommRequest* req, int timeout_ms) {
    (void)req;
    (void)timeout_ms;
    return false;
  }

  // Collective: a communicator over the ranks that pass the same
  // `color` >= 0, ordered by `key` (ties by rank). A rank passing a negative
  // color takes part but gets null.
  virtual Status Split(int color, int key, std::shared_ptr<Communicator>* out) = 0;
  // Collective: the same ranks, traffic kept apart from this one's.
  virtual Status Dup(std::shared_ptr<Communicator>* out) = 0;

  // Told that the process of `rank` (of this communicator) is gone, found by
  // other means than this transport (the peer monitor). A transport that can
  // tells the other ranks now, naming `rank`, and stops using its
  // connections: a rank that has not noticed yet must not see this one
  // close first and blame it. MPI cannot, and ignores it.
  virtual void PeerProcessExited(int rank) { (void)rank; }

  // What ended this transport's connections (a peer found gone, silent or
  // misbehaving), typed with its cause and rank; OK while it works. Data
  // planes that wait outside the transport (shared memory) learn of it
  // through the peer monitor, which asks here: a stopped process is alive
  // to the monitor, but its silence is seen by the transport. A transport
  // that cannot tell (MPI) always says OK.
  virtual Status TransportFailure() { return Status::OK(); }

  // Largest tag a caller may use (at least 32767, MPI's guaranteed minimum).
  virtual int max_tag() const { return 32767; }

  // Watches processes of this host (see PeerMonitor); the waits below
  // consult it, and sub-communicators inherit it.
  const std::shared_ptr<PeerMonitor>& monitor() const { return monitor_; }
  void set_monitor(std::shared_ptr<PeerMonitor> m) { monitor_ = std::move(m); }

  // Waits for `req`. `spin` keeps polling (data movement: the transport may
  // progress only inside Test); otherwise an idle wait backs off to short
  // sleeps so a quiet job costs almost no CPU. On a transport that can
  // Block(), either kind polls only briefly and then blocks. `what` names
  // the operation in errors. A dead peer ends the wait with ABORTED.
  Status Wait(CommRequest* req, const char* what, bool spin);
  // Waits for all of `reqs` (null entries are skipped); on error cancels the
  // rest, so no buffer is written after this returns.
  Status WaitAll(std::vector<CommRequestPtr>* reqs, const char* what, bool spin);

 private:
  std::shared_ptr<PeerMonitor> monitor_;
};

// While this rank has collectives pending, idle waits poll eagerly (latency
// matters); when it is idle they back off to 1 ms sleeps (CPU matters).
void SetUrgentWaits(bool urgent);
bool UrgentWaits();

// Small collectives built from point-to-point messages, for transports (and
// set-up steps) that need nothing faster. Tags from kCollectiveTagBase up are
// reserved for them.
constexpr int kCollectiveTagBase = 32000;

// Every rank's `ok` combined (AND), so that all ranks of a communicator take
// the same decision after a step that may fail on some of them.
Status AgreeAll(Communicator& comm, bool ok, bool* all_ok);
// Rank 0 receives every rank's bytes (index = rank) in `all`.
Status GatherBytes(Communicator& comm, const std::string& mine, std::vector<std::string>* all);
// Rank 0's `bytes` reach every rank.
Status BroadcastBytes(Communicator& comm, std::string* bytes);
// Bitwise AND of `words` across ranks, in place (same length on every rank).
Status AllreduceBitsAnd(Communicator& comm, std::vector<uint64_t>* words);
Status BarrierP2P(Communicator& comm);

}  // namespace tfring

#endif  // TFRING_COMMON_TRANSPORT_COMMUNICATOR_H
