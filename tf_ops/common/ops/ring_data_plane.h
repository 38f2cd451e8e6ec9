// Data planes built on point-to-point messages only (transport/communicator.h),
// so that any transport gets them: MPI and our own TCP alike.
//
// The ring plane runs allreduce as a segmented, pipelined ring (scatter-reduce
// then allgather, or by size recursive doubling or Rabenseifner: see
// allreduce_algorithms.h), allgather, broadcast and reducescatter as rings (or a
// chain) too, alltoall as pairwise exchanges, barrier through BarrierP2P and
// Adasum through pairwise exchanges. It is complete, so it can be a
// transport's neutral fallback plane as well as the cross-host plane. The
// hierarchical plane reduces within each host first (shared memory when
// available, a ring on the host-local communicator otherwise), runs the
// cross-host ring, and shares the result within each host again.
#ifndef TFRING_COMMON_OPS_RING_DATA_PLANE_H
#define TFRING_COMMON_OPS_RING_DATA_PLANE_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../config.h"
#include "../transport/communicator.h"
#include "data_plane.h"

namespace tfring {

// Collective over comm: duplicates it so that ring messages never match any
// other traffic. `allreduce` is what Allreduce runs (allreduce_algorithms.h):
// AUTO measures the set's link costs at the first allreduce and then takes,
// for each message, the algorithm the model predicts fastest.
Status CreateRingDataPlane(std::shared_ptr<Communicator> comm, std::unique_ptr<DataPlane>* out,
                           AllreduceAlgorithm allreduce = AllreduceAlgorithm::AUTO);

// `hosts[i]` is the host of the set's rank i (TFRING_HOSTNAME overrides it,
// which is how tests fake several hosts on one machine). Collective over comm.
// Its cross-host stage runs `allreduce` among the hosts.
Status CreateHierarchicalDataPlane(std::shared_ptr<Communicator> comm,
                                   const std::vector<std::string>& hosts,
                                   std::unique_ptr<DataPlane>* out,
                                   AllreduceAlgorithm allreduce = AllreduceAlgorithm::AUTO);

namespace ring_internal {

// Tuning of the ring pipeline; the defaults are what the factories above use.
// Tests set small segments to drive the pipeline through many pieces.
struct RingOptions {
  // Bytes per pipelined message; 0 chooses by message size (see PieceBytes
  // in ring_data_plane.cc).
  int64_t segment_bytes = 0;
  // Receives kept posted ahead of the one being reduced; 0 = default.
  int window = 0;
  // What Allreduce runs (see CreateRingDataPlane above).
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::AUTO;
};

// `duplicate` false uses `comm` itself (it must be private to the plane).
Status CreateRingDataPlane(std::shared_ptr<Communicator> comm, bool duplicate,
                           const RingOptions& options, std::unique_ptr<DataPlane>* out);
Status CreateHierarchicalDataPlane(std::shared_ptr<Communicator> comm,
                                   const std::vector<std::string>& hosts,
                                   const RingOptions& options, std::unique_ptr<DataPlane>* out);

}  // namespace ring_internal
}  // namespace tfring

#endif  // TFRING_COMMON_OPS_RING_DATA_PLANE_H
