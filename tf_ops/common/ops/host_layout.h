// Where a rank sits among the hosts of its process set, and how a
// hierarchical allreduce splits a buffer among a host's ranks. Shared by the
// host planes' hierarchical allreduce (hierarchical_data_plane.cc) and the
// GPU one (hierarchical_gpu_data_plane.h), so that both cut the buffer the
// same way. Every rank computes the same answer from the same host list.
#ifndef TFRING_COMMON_OPS_HOST_LAYOUT_H
#define TFRING_COMMON_OPS_HOST_LAYOUT_H

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tfring {

struct HostLayout {
  int host = 0;         // this rank's host, numbered in order of first appearance
  int hosts = 0;        // how many hosts the set spans
  int local_rank = 0;   // this rank's position among its host's ranks
  int local_size = 1;   // ranks on this rank's host
  // Cross-host lanes: the smallest number of ranks on any host. Lane l joins
  // the l-th rank of every host; local ranks >= lanes take no share.
  int lanes = 1;
};

// The layout of rank `rank` of a set whose rank i runs on hosts[i].
inline HostLayout LayOutHosts(const std::vector<std::string>& hosts, int rank) {
  std::map<std::string, int> index;
  std::vector<int> host_of(hosts.size()), ranks_on;
  for (size_t i = 0; i < hosts.size(); ++i) {
    auto it = index.find(hosts[i]);
    if (it == index.end()) {
      it = index.emplace(hosts[i], static_cast<int>(ranks_on.size())).first;
      ranks_on.push_back(0);
    }
    host_of[i] = it->second;
    ++ranks_on[it->second];
  }
  HostLayout l;
  l.host = host_of[rank];
  l.hosts = static_cast<int>(ranks_on.size());
  l.local_rank = 0;
  for (int i = 0; i < rank; ++i) l.local_rank += host_of[i] == l.host ? 1 : 0;
  l.local_size = ranks_on[l.host];
  l.lanes = *std::min_element(ranks_on.begin(), ranks_on.end());
  return l;
}

// Elements of a `count`-element buffer that each of a host's `local_size`
// ranks reduces across hosts: share l (in rank order) goes to lane l; ranks
// beyond the lanes get none.
inline std::vector<int64_t> LaneShares(int64_t count, int lanes, int local_size) {
  std::vector<int64_t> counts(local_size, 0);
  for (int l = 0; l < lanes && l < local_size; ++l) {
    counts[l] = count / lanes + (l < count % lanes ? 1 : 0);
  }
  return counts;
}

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_HOST_LAYOUT_H
