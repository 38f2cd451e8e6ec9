// The job's layout as init() learns it: which ranks share a host (local
// rank and size) and which ranks have the same local rank (cross rank and
// size). Internal to tf_ops/common (lifecycle.cc).
#ifndef TFRING_COMMON_TOPOLOGY_H
#define TFRING_COMMON_TOPOLOGY_H

#include <string>
#include <vector>

#include "config.h"
#include "peer_monitor.h"
#include "process_set.h"
#include "status.h"

namespace tfring {

struct Topology {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  bool homogeneous = true;
};

// One allgather on `global` (the bootstrap set): every rank's host name (as
// TFRING_HOSTNAME may set it), real host and pid. Fills `topo`, the peers
// the peer monitor watches, this rank's real host and every rank's host.
Status ComputeTopology(ProcessSet& global, const Config& config, Topology* topo,
                       std::vector<PeerMonitor::Peer>* peers, std::string* my_real_host,
                       std::vector<std::string>* host_names);

}  // namespace tfring

#endif  // TFRING_COMMON_TOPOLOGY_H
