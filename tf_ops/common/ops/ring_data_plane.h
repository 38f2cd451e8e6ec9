// Data planes for process sets that span several hosts.
//
// The ring plane runs allreduce as a segmented, pipelined ring (scatter-reduce
// then allgather) over MPI point-to-point messages, and allgather, broadcast
// and reducescatter as rings (or a chain) too. The hierarchical plane reduces
// within each host first (shared memory when available, MPI on a host-local
// communicator otherwise), runs the cross-host ring, and shares the result
// within each host again.
#ifndef TFRING_COMMON_OPS_RING_DATA_PLANE_H
#define TFRING_COMMON_OPS_RING_DATA_PLANE_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../mpi/mpi_context.h"
#include "data_plane.h"

namespace tfring {

// Collective over comm: duplicates it so that ring messages never match any
// other traffic.
Status CreateRingDataPlane(std::shared_ptr<MPICommunicator> comm, std::unique_ptr<DataPlane>* out);

// `hosts[i]` is the host of the set's rank i (TFRING_HOSTNAME overrides it,
// which is how tests fake several hosts on one machine). Collective over comm.
Status CreateHierarchicalDataPlane(std::shared_ptr<MPICommunicator> comm,
                                   const std::vector<std::string>& hosts,
                                   std::unique_ptr<DataPlane>* out);

namespace ring_internal {

// Tuning of the ring pipeline; the defaults are what the factories above use.
// Tests set small segments to drive the pipeline through many pieces.
struct RingOptions {
  // Bytes per pipelined message; 0 chooses by message size (see PieceBytes
  // in ring_data_plane.cc).
  int64_t segment_bytes = 0;
  // Receives kept posted ahead of the one being reduced; 0 = default.
  int window = 0;
};

// `duplicate` false uses `comm` itself (it must be private to the plane).
Status CreateRingDataPlane(std::shared_ptr<MPICommunicator> comm, bool duplicate,
                           const RingOptions& options, std::unique_ptr<DataPlane>* out);
Status CreateHierarchicalDataPlane(std::shared_ptr<MPICommunicator> comm,
                                   const std::vector<std::string>& hosts,
                                   const RingOptions& options, std::unique_ptr<DataPlane>* out);

// Every rank's `ok` combined (AND) over comm, so that all ranks of a set take
// the same decision after a set-up step that may fail on some of them.
Status AgreeAll(MPICommunicator& comm, bool ok, bool* all_ok);

}  // namespace ring_internal
}  // namespace tfring

#endif  // TFRING_COMMON_OPS_RING_DATA_PLANE_H
