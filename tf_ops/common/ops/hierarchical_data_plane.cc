// The hierarchical data plane, for a process set spread over several hosts.
//
// Allreduce runs in three stages:
//   1. within each host, a reduce-scatter: local rank l gets share l of the
//      host's sum (through the shared-memory plane when it is available,
//      a ring on the host-local communicator otherwise);
//   2. across hosts, local rank l of every host runs an allreduce over
//      share l with the l-th ranks of the other hosts ("lane" l): the ring
//      plane's, so the algorithm chosen for it (allreduce_algorithms.h);
//   3. within each host, an allgather of the shares.
// Compared with reducing everything to one leader per host, this keeps every
// local rank (and, on real clusters, every NIC queue and core) busy in the
// cross-host stage: each lane carries 1/L of the data, so the cross-host time
// falls by about L, and the intra-host stages move the same bytes as a reduce
// plus a broadcast would. It is what Horovod's hierarchical allreduce and
// NCCL's tree/ring hybrids do.
//
// Hosts with different numbers of ranks (e.g. a,a,b) get L = the smallest
// local size lanes; local ranks >= L take no share and sit out stage 2, so
// with a single-rank host this is exactly "reduce to the leader, ring among
// leaders, broadcast from the leader". Lane 0 is the leaders' communicator
// (the first rank of every host).
//
// The other collectives move data once between every pair of ranks anyway,
// so they use the flat ring over the whole set (Adasum too: its pairs are
// chosen by rank, not by host).
//
// Everything runs on point-to-point messages of the set's communicator and
// communicators split from it, whatever the transport.
#include <algorithm>
#include <cstring>

#include "../logging.h"
#include "../mapped_buffer.h"
#include "host_layout.h"
#include "ring_data_plane.h"
#include "shm_data_plane.h"

namespace tfring {
namespace ring_internal {
namespace {

class HierarchicalDataPlane : public DataPlane {
 public:
  const char* name() const override { return "hierarchical"; }

  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgather(const void* send, void* recv, const std::vector<int64_t>& recv_bytes) override {
    return flat_->Allgather(send, recv, recv_bytes);
  }
  Status Broadcast(void* buffer, int64_t bytes, int root) override {
    return flat_->Broadcast(buffer, bytes, root);
  }
  Status Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes) override {
    return flat_->Alltoall(send, send_bytes, recv, recv_bytes);
  }
  Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override {
    return flat_->Reducescatter(send, recv, recv_counts, dtype, op);
  }
  Status Barrier() override { return flat_->Barrier(); }
  Status Adasum(void* buffer, const std::vector<int64_t>& counts, DataType dtype) override {
    return flat_->Adasum(buffer, counts, dtype);
  }

  std::unique_ptr<DataPlane> flat_;  // ring over the whole set
  std::shared_ptr<Communicator> local_comm_, lane_comm_;
  // Declared before local_shm_ so the shared-memory plane goes first.
  std::unique_ptr<DataPlane> local_ring_;
  std::unique_ptr<DataPlane> local_shm_;
  DataPlane* local_ = nullptr;       // local_shm_ or local_ring_ (null: alone on the host)
  std::unique_ptr<DataPlane> lane_;  // ring among the local_rank-th ranks of every host
  int local_rank_ = 0, local_size_ = 1, lanes_ = 1;
  MappedBuffer share_;
};

Status HierarchicalDataPlane::Allreduce(const void* input, void* output, int64_t count,
                                        DataType dtype, ReduceOp op) {
  if (op != ReduceOp::SUM && op != ReduceOp::MIN && op != ReduceOp::MAX &&
      op != ReduceOp::PRODUCT) {
    return Status::InvalidArgument(
        std::string("tfring: the hierarchical data plane cannot run allreduce with reduce op ") +
        ReduceOpName(op));
  }
  if (count <= 0) return Status::OK();
  const int64_t esize = DataTypeSize(dtype);
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  // Share l of the buffer belongs to lane l; local ranks beyond the lanes get
  // nothing. Every rank of the set computes the same shares.
  const std::vector<int64_t> counts = LaneShares(count, lanes_, local_size_);
  const int64_t mine = counts[local_rank_];

  if (local_ == nullptr) {
    // Alone on this host: the whole buffer is this rank's share.
    if (lane_) return lane_->Allreduce(in, out, count, dtype, op);
    if (out != in) std::memcpy(out, in, count * esize);
    return Status::OK();
  }
  share_.Reserve(static_cast<size_t>(std::max<int64_t>(1, mine * esize)));
  // Out of place by construction: the input is only read by the
  // reducescatter, the output only written by the allgather.
  TFRING_RETURN_IF_ERROR(local_->Reducescatter(in, share_.data(), counts, dtype, op));
  if (lane_ && mine > 0) TFRING_RETURN_IF_ERROR(lane_->Allreduce(share_.data(), mine, dtype, op));
  std::vector<int64_t> bytes(local_size_);
  for (int l = 0; l < local_size_; ++l) bytes[l] = counts[l] * esize;
  return local_->Allgather(share_.data(), out, bytes);
}

}  // namespace

Status CreateHierarchicalDataPlane(std::shared_ptr<Communicator> comm,
                                   const std::vector<std::string>& hosts,
                                   const RingOptions& options, std::unique_ptr<DataPlane>* out) {
  if (!comm) {
    return Status::InvalidArgument("tfring: the hierarchical data plane needs a communicator");
  }
  const int n = comm->size(), rank = comm->rank();
  if (static_cast<int>(hosts.size()) != n) {
    return Status::InvalidArgument("tfring: the hierarchical data plane got " +
                                   std::to_string(hosts.size()) + " host names for " +
                                   std::to_string(n) + " ranks");
  }
  const HostLayout layout = LayOutHosts(hosts, rank);
  const int my_host = layout.host, local_rank = layout.local_rank;
  const int local_size = layout.local_size, lanes = layout.lanes;

  std::unique_ptr<HierarchicalDataPlane> plane(new HierarchicalDataPlane());
  plane->local_rank_ = local_rank;
  plane->local_size_ = local_size;
  plane->lanes_ = lanes;
  // Every step below is collective over comm (or over a communicator split
  // from it), in the same order on every rank.
  TFRING_RETURN_IF_ERROR(CreateRingDataPlane(comm, true, options, &plane->flat_));

  TFRING_RETURN_IF_ERROR(comm->Split(my_host, rank, &plane->local_comm_));
  if (!plane->local_comm_) {
    return Status::Aborted("tfring: splitting the host-local communicator gave rank " +
                           std::to_string(rank) + " none");
  }
  // Ranks beyond the lanes pass a negative color: they get no lane.
  TFRING_RETURN_IF_ERROR(
      comm->Split(local_rank < lanes ? local_rank : -1, rank, &plane->lane_comm_));
  if (plane->lane_comm_) {
    // The lane communicator is private to this plane: no duplicate needed.
    if (plane->lane_comm_->size() > 1) {
      TFRING_RETURN_IF_ERROR(
          CreateRingDataPlane(plane->lane_comm_, false, options, &plane->lane_));
    }
  }

  const char* intra = "none";
  if (local_size > 1) {
    // The host-local communicator is private to this plane too; its ring
    // also bootstraps the shared-memory plane.
    TFRING_RETURN_IF_ERROR(
        CreateRingDataPlane(plane->local_comm_, false, options, &plane->local_ring_));
    Status shm = CreateShmDataPlane(local_rank, local_size, plane->local_ring_.get(),
                                    comm->monitor(), &plane->local_shm_);
    // The shared-memory plane is used only if every rank of the host got it.
    bool all_ok = false;
    TFRING_RETURN_IF_ERROR(AgreeAll(*plane->local_comm_, shm.ok(), &all_ok));
    if (all_ok) {
      plane->local_ = plane->local_shm_.get();
      intra = "shared memory";
    } else {
      TFRING_LOG(DEBUG) << "hierarchical data plane: intra-host stage over a ring"
                        << (shm.ok() ? std::string(" (shared memory failed on a peer)")
                                     : ": " + shm.message());
      plane->local_shm_.reset();
      plane->local_ = plane->local_ring_.get();
      intra = "ring";
    }
  }
  TFRING_LOG(DEBUG) << "hierarchical data plane: rank " << rank << " of " << n << ", host "
                    << my_host << " of " << layout.hosts << ", local rank " << local_rank
                    << " of " << local_size << ", " << lanes << " cross-host lane(s), intra-host "
                    << intra;
  *out = std::move(plane);
  return Status::OK();
}

}  // namespace ring_internal

Status CreateHierarchicalDataPlane(std::shared_ptr<Communicator> comm,
                                   const std::vector<std::string>& hosts,
                                   std::unique_ptr<DataPlane>* out, AllreduceAlgorithm allreduce) {
  ring_internal::RingOptions options;
  options.allreduce = allreduce;
  return ring_internal::CreateHierarchicalDataPlane(std::move(comm), hosts, options, out);
}

}  // namespace tfring
