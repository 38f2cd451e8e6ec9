#include "topology.h"

#include <algorithm>
#include <cstring>
#include <unistd.h>

namespace tfring {

namespace {

// What each rank tells the others at init.
struct RankInfo {
  static constexpr int kHostBytes = 256;
  char host[kHostBytes];       // for topology: TFRING_HOSTNAME if set
  char real_host[kHostBytes];  // for the peer monitor
  int64_t pid;
};

}  // namespace

Status ComputeTopology(ProcessSet& global, const Config& config, Topology* topo,
                       std::vector<PeerMonitor::Peer>* peers, std::string* my_real_host,
                       std::vector<std::string>* host_names) {
  RankInfo mine;
  std::memset(&mine, 0, sizeof(mine));
  gethostname(mine.real_host, RankInfo::kHostBytes - 1);
  std::strncpy(mine.host, config.HostnameFor(global.rank, mine.real_host).c_str(),
               RankInfo::kHostBytes - 1);
  mine.pid = getpid();
  const int n = global.size();
  std::vector<RankInfo> all(n);
  TFRING_RETURN_IF_ERROR(global.data_plane->Allgather(
      &mine, all.data(), std::vector<int64_t>(n, static_cast<int64_t>(sizeof(RankInfo)))));
  std::vector<std::string> hosts(n);
  for (int r = 0; r < n; ++r) {
    hosts[r] = std::string(all[r].host);
    peers->push_back({r, static_cast<int>(all[r].pid), std::string(all[r].real_host)});
  }
  *my_real_host = mine.real_host;
  *host_names = hosts;
  topo->rank = global.rank;
  topo->size = n;
  std::vector<int> local_rank(n), local_size(n);
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      if (hosts[q] != hosts[r]) continue;
      ++local_size[r];
      if (q < r) ++local_rank[r];
    }
  }
  topo->local_rank = local_rank[topo->rank];
  topo->local_size = local_size[topo->rank];
  topo->cross_rank = 0;
  topo->cross_size = 0;
  for (int q = 0; q < n; ++q) {
    if (local_rank[q] != topo->local_rank) continue;
    ++topo->cross_size;
    if (q < topo->rank) ++topo->cross_rank;
  }
  topo->homogeneous = std::all_of(local_size.begin(), local_size.end(),
                                  [&](int s) { return s == local_size[0]; });
  return Status::OK();
}

}  // namespace tfring
