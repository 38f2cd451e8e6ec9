// Notices when another rank's process on this host has died, so that a rank
// waiting for it in a collective fails with an error naming it instead of
// hanging forever. (MPI itself may wait indefinitely on a dead peer.)
// Peers on other hosts are watched by the launcher, which stops the job.
#ifndef TFRING_COMMON_PEER_MONITOR_H
#define TFRING_COMMON_PEER_MONITOR_H

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "status.h"

namespace tfring {

class PeerMonitor {
 public:
  struct Peer {
    int rank;
    int pid;
    std::string host;  // the real host name, not a TFRING_HOSTNAME override
  };

  // Watches the peers that share `my_host`, except `my_rank` itself.
  PeerMonitor(int my_rank, const std::string& my_host, const std::vector<Peer>& peers,
              double interval_s = 0.2);

  // OK while every watched peer lives; otherwise an ABORTED status naming the
  // first peer found dead (and the same status on every later call). Checks
  // at most once per interval, so it is cheap to call in a polling loop.
  Status Check();

  // Called once, with the job-wide rank, when Check() first finds a peer
  // dead (on the thread that called Check, outside the monitor's lock). The
  // transport uses it to tell the other ranks which rank died before this
  // one, failing too, closes its connections: otherwise a rank that has not
  // noticed yet sees this one leave first and names it as the cause.
  void set_on_death(std::function<void(int rank)> listener);

  // Asked by Check() (at most once per interval) whether the transport has
  // failed: a peer that is alive but silent (stopped, or on a host cut off)
  // is found by the transport's heartbeats, not by the process check, and
  // waits outside the transport must end then too. Check() then returns the
  // transport's status, with its cause and rank.
  void set_transport_probe(std::function<Status()> probe);

  static bool ProcessAlive(int pid);

  // True when this host's ranks (this process and the watched peers)
  // outnumber the CPUs they may run on together, as their affinity masks
  // said at construction. Then a rank that busy-waits for a peer takes the
  // core that peer needs to answer, so waits should block at once (the
  // shared-memory plane's ShmWaitPolicy makes the same choice).
  bool outnumbered() const { return outnumbered_; }
  // The number of CPUs in the union of the affinity masks of `pids` (0:
  // this process). A pid whose mask cannot be read (gone, or another
  // user's) adds none.
  static int CpusOf(const std::vector<int>& pids);

 private:
  std::vector<Peer> local_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point last_check_;
  std::mutex mu_;
  Status failed_;
  // Shared, so that Check() takes them out of the lock by a reference
  // count: copying a std::function whose lambda holds a weak_ptr allocated,
  // on every check of a slow wait (issue 38's allocation count under load).
  std::shared_ptr<const std::function<void(int)>> on_death_;
  std::shared_ptr<const std::function<Status()>> transport_probe_;
  bool outnumbered_ = false;
};

}  // namespace tfring

#endif  // TFRING_COMMON_PEER_MONITOR_H
