// Which data planes a process set gets, whatever its transport: the same
// policy for MPI and TCP, so a transport only supplies its communicator and,
// if it has one, a fallback plane of its own.
//
// TFRING_CPU_OPERATIONS (config.cpu_operations) decides:
//   auto: the shared-memory plane when all ranks are on one host, the ring
//         (or, with TFRING_HIERARCHICAL_ALLREDUCE, the hierarchical) plane
//         when they are on several;
//   shm:  the shared-memory plane when all ranks are on one host;
//   ring: the ring (or hierarchical) plane, on one host too;
//   anything else: the fallback plane only.
// Each plane is used from its cut-over size up (TFRING_SHM_MIN_BYTES,
// TFRING_CROSS_HOST_MIN_BYTES); smaller messages, alltoall and barrier run on
// the fallback. A plane that cannot be created (no /dev/shm, ...) is logged
// and left out: the fallback covers for it.
#ifndef TFRING_COMMON_OPS_DATA_PLANE_FACTORY_H
#define TFRING_COMMON_OPS_DATA_PLANE_FACTORY_H

#include <memory>
#include <string>
#include <vector>

#include "../config.h"
#include "../transport/communicator.h"
#include "data_plane.h"

namespace tfring {

// Collective over `comm` (every rank of the set calls it, with the same
// `hosts` and config): the planes for a set over `comm` whose rank i runs on
// hosts[i] (empty: not known yet, e.g. at start-up before the topology
// exchange; only the fallback is made then), behind a DataPlaneSelector.
// `fallback` is the transport's own complete plane (MPI's); null makes it a
// ring plane on a Dup of `comm`. `job_rank` is this rank's job-wide rank,
// which a plane's failure on the peers names when this rank leaves it. Returns null only when no fallback could be
// made (the communicator failed; the log says why).
std::unique_ptr<DataPlane> MakeDataPlane(const std::shared_ptr<Communicator>& comm,
                                         std::unique_ptr<DataPlane> fallback,
                                         const std::vector<std::string>& hosts,
                                         const Config& config, int job_rank);

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_DATA_PLANE_FACTORY_H
