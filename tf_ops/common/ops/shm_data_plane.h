// The intra-host shared-memory data plane: for a process set whose ranks all
// run on this host, collectives go through one shared segment instead of
// the transport's messages. The reduction is split across the ranks (each
// reduces its share) and pipelined in chunks.
#ifndef TFRING_COMMON_OPS_SHM_DATA_PLANE_H
#define TFRING_COMMON_OPS_SHM_DATA_PLANE_H

#include <memory>

#include "../peer_monitor.h"
#include "data_plane.h"

namespace tfring {

// Collective over the set's ranks: rank 0 creates the segment and shares its
// name through `bootstrap` (which must outlive nothing: it is only used here).
// The segment is unlinked as soon as every rank has mapped it, so nothing is
// left in /dev/shm whatever way the processes end. `monitor` lets waits give
// up when a peer dies.
Status CreateShmDataPlane(int rank, int size, DataPlane* bootstrap,
                          std::shared_ptr<PeerMonitor> monitor, std::unique_ptr<DataPlane>* out);

// Tuning knobs, for tests and benchmarks: chunk_bytes 0, or a negative
// small_allreduce_bytes or spin_ns, means "choose". Rank 0's chunk and
// small-allreduce sizes are used by every rank.
struct ShmOptions {
  // Bytes one rank handles per pipeline step, rounded up to 4 KiB. The
  // segment is 2 x size^2 x chunk bytes, whatever the message size.
  int64_t chunk_bytes = 0;
  // Allreduces up to this many bytes run in one step (every rank reduces the
  // whole message) rather than split and pipelined in two or more.
  int64_t small_allreduce_bytes = -1;
  // How long a waiting rank busy-polls before it yields and sleeps; by
  // default 100 us, or 2 us when the set's ranks share fewer CPUs than ranks.
  int64_t spin_ns = -1;
  // Whether this rank lets broadcasts and allgathers read other ranks'
  // memory directly (process_vm_readv) when the system permits it. The
  // ranks agree at set-up: if any rank refuses or is refused, none does.
  // Off by default: measured inside TensorFlow, the staged path was as fast
  // or faster (see the note in shm_single_copy.cc).
  bool single_copy = false;
  // Broadcasts and allgathers (counting the whole output) of at least this
  // many bytes take the single-copy path; negative: choose. Rank 0's value
  // is used by every rank.
  int64_t single_copy_min_bytes = -1;
  // This rank's job-wide rank, which the peers' errors name if it leaves the
  // plane while they wait for it (-1: unknown, they name none).
  int job_rank = -1;
};

Status CreateShmDataPlane(int rank, int size, DataPlane* bootstrap,
                          std::shared_ptr<PeerMonitor> monitor, const ShmOptions& options,
                          std::unique_ptr<DataPlane>* out);

// Whether `plane` is a shared-memory plane whose ranks agreed at set-up to
// read each other's memory directly (for tests and logs).
bool ShmSingleCopy(const DataPlane& plane);

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_SHM_DATA_PLANE_H
