#include "mpi_data_plane.h"

#include <limits>

#include "comm_point_to_point.h"

namespace tfring {
namespace {

constexpr int64_t kMaxCount = std::numeric_limits<int>::max();

// MPI counts are ints; turn a list of 64-bit byte counts into counts and
// displacements, or an error naming the limit.
Status ToIntCounts(const std::vector<int64_t>& bytes, std::vector<int>* counts,
                   std::vector<int>* displs, const char* what) {
  counts->resize(bytes.size());
  displs->resize(bytes.size());
  int64_t offset = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > kMaxCount || offset > kMaxCount) {
      return Status::InvalidArgument(std::string("tfring: ") + what +
                                     " exceeds the MPI data plane's 2 GiB per-message limit");
    }
    (*counts)[i] = static_cast<int>(bytes[i]);
    (*displs)[i] = static_cast<int>(offset);
    offset += bytes[i];
  }
  return Status::OK();
}

}  // namespace

Status MPIDataPlane::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                               ReduceOp op) {
  MPI_Op mpi_op;
  TFRING_RETURN_IF_ERROR(MPIReduceOp(dtype, op, &mpi_op));
  // Non-blocking collectives and a polling wait, so that a dead peer (noticed
// by the communicator's peer monitor) ends the wait with an error.
// Split very large buffers so each call stays within MPI's int counts.
  char* p = static_cast<char*>(output);
  const char* in = static_cast<const char*>(input);
  const int64_t esize = DataTypeSize(dtype);
  for (int64_t done = 0; done < count;) {
    int64_t n = std::min(count - done, kMaxCount);
    MPI_Request req;
    const void* send = in == p ? MPI_IN_PLACE : in + done * esize;
    TFRING_RETURN_IF_ERROR(MPIStatus(MPI_Iallreduce(send, p + done * esize,
                                                    static_cast<int>(n), MPIDataType(dtype),
                                                    mpi_op, comm_->get(), &req),
                                     "Iallreduce"));
    TFRING_RETURN_IF_ERROR(comm_->Wait(&req, "Iallreduce", true));
    done += n;
  }
  return Status::OK();
}

Status MPIDataPlane::Allgather(const void* send, void* recv, const std::vector<int64_t>& recv_bytes) {
  std::vector<int> counts, displs;
  TFRING_RETURN_IF_ERROR(ToIntCounts(recv_bytes, &counts, &displs, "allgather"));
  MPI_Request req;
  TFRING_RETURN_IF_ERROR(MPIStatus(MPI_Iallgatherv(send, counts[comm_->rank()], MPI_BYTE, recv,
                                                   counts.data(), displs.data(), MPI_BYTE,
                                                   comm_->get(), &req),
                                   "Iallgatherv"));
  return comm_->Wait(&req, "Iallgatherv", true);
}

Status MPIDataPlane::Broadcast(void* buffer, int64_t bytes, int root) {
  // Every rank has validated the same size, so all skip an empty broadcast.
  char* p = static_cast<char*>(buffer);
  for (int64_t done = 0; done < bytes;) {
    int64_t n = std::min(bytes - done, kMaxCount);
    MPI_Request req;
    TFRING_RETURN_IF_ERROR(MPIStatus(
        MPI_Ibcast(p + done, static_cast<int>(n), MPI_BYTE, root, comm_->get(), &req), "Ibcast"));
    TFRING_RETURN_IF_ERROR(comm_->Wait(&req, "Ibcast", true));
    done += n;
  }
  return Status::OK();
}

Status MPIDataPlane::Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                              const std::vector<int64_t>& recv_bytes) {
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  TFRING_RETURN_IF_ERROR(ToIntCounts(send_bytes, &scounts, &sdispls, "alltoall"));
  TFRING_RETURN_IF_ERROR(ToIntCounts(recv_bytes, &rcounts, &rdispls, "alltoall"));
  MPI_Request req;
  TFRING_RETURN_IF_ERROR(MPIStatus(MPI_Ialltoallv(send, scounts.data(), sdispls.data(), MPI_BYTE,
                                                  recv, rcounts.data(), rdispls.data(), MPI_BYTE,
                                                  comm_->get(), &req),
                                   "Ialltoallv"));
  return comm_->Wait(&req, "Ialltoallv", true);
}

Status MPIDataPlane::Reducescatter(const void* send, void* recv,
                                   const std::vector<int64_t>& recv_counts, DataType dtype,
                                   ReduceOp op) {
  MPI_Op mpi_op;
  TFRING_RETURN_IF_ERROR(MPIReduceOp(dtype, op, &mpi_op));
  std::vector<int> counts, displs;
  TFRING_RETURN_IF_ERROR(ToIntCounts(recv_counts, &counts, &displs, "reducescatter"));
  MPI_Request req;
  TFRING_RETURN_IF_ERROR(MPIStatus(MPI_Ireduce_scatter(send, recv, counts.data(),
                                                       MPIDataType(dtype), mpi_op, comm_->get(),
                                                       &req),
                                   "Ireduce_scatter"));
  return comm_->Wait(&req, "Ireduce_scatter", true);
}

Status MPIDataPlane::Barrier() {
  MPI_Request req;
  TFRING_RETURN_IF_ERROR(MPIStatus(MPI_Ibarrier(comm_->get(), &req), "Ibarrier"));
  // A barrier can wait long on a slow rank: sleep between polls.
  return comm_->Wait(&req, "Ibarrier", false);
}

Status MPIDataPlane::Adasum(void* buffer, const std::vector<int64_t>& counts, DataType dtype) {
  if (!adasum_p2p_) {
    std::shared_ptr<Communicator> dup;
    TFRING_RETURN_IF_ERROR(comm_->Dup(&dup));
    adasum_p2p_.reset(new CommPointToPoint(std::move(dup), 0));
  }
  return AdasumAllreduce(adasum_p2p_.get(), buffer, counts, dtype, &adasum_scratch_);
}

}  // namespace tfring
