// Rank registration records and the topology derived from them: the same
// rules and record format as tfring/runner/topology.py (docs/wire.md,
// "Topology"), so a rank in C++ and a tool in Python agree on every rank.
#ifndef TFRING_TRANSPORT_TCP_TOPOLOGY_H
#define TFRING_TRANSPORT_TCP_TOPOLOGY_H

#include <cstdint>
#include <string>
#include <vector>

#include "wire.h"

namespace tfring {
namespace tcp {

struct Registration {
  std::string host;
  int64_t pid = 0;
  std::string addr;  // "host:port" the rank listens on
  int64_t slot = 0;  // local slot on its host
  int64_t order = -1;  // the host's index in the launcher's host list, -1 if none
};

struct RankInfo {
  int rank = 0, size = 0, local_rank = 0, local_size = 0, cross_rank = 0, cross_size = 0;
  Registration reg;
};

std::string EncodeRegistration(const Registration& r);
// INVALID_ARGUMENT naming `key` for a malformed record.
WireStatus DecodeRegistration(const std::string& data, const std::string& key,
                              Registration* out);
// Pure: same registrations in any order give the same ranks. INVALID_ARGUMENT
// for none, a duplicate host+slot, a negative slot or conflicting order hints.
WireStatus DeriveTopology(const std::vector<Registration>& regs, std::vector<RankInfo>* out);

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_TOPOLOGY_H
