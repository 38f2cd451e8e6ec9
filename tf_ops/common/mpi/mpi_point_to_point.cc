#include "mpi_point_to_point.h"

#include <algorithm>
#include <limits>

namespace tfring {

Status MPIPointToPoint::SendRecv(const void* send, int64_t send_bytes, void* recv,
                                 int64_t recv_bytes, int peer) {
  // MPI counts are ints: a large exchange goes as several messages, which
  // MPI delivers in order between the same two ranks.
  constexpr int64_t kMaxMessage = std::numeric_limits<int>::max();
  constexpr int kTag = 7;
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  int64_t sent = 0, received = 0;
  do {
    const int n_send = static_cast<int>(std::min(send_bytes - sent, kMaxMessage));
    const int n_recv = static_cast<int>(std::min(recv_bytes - received, kMaxMessage));
    MPI_Request reqs[2];
    TFRING_RETURN_IF_ERROR(MPIStatus(
        MPI_Irecv(r + received, n_recv, MPI_BYTE, peer, kTag, comm_->get(), &reqs[0]), "Irecv"));
    Status st = MPIStatus(
        MPI_Isend(s + sent, n_send, MPI_BYTE, peer, kTag, comm_->get(), &reqs[1]), "Isend");
    if (!st.ok()) {
      MPI_Cancel(&reqs[0]);
      MPI_Request_free(&reqs[0]);
      return st;
    }
    TFRING_RETURN_IF_ERROR(comm_->Wait(&reqs[0], "Irecv (pairwise exchange)", true));
    TFRING_RETURN_IF_ERROR(comm_->Wait(&reqs[1], "Isend (pairwise exchange)", true));
    sent += n_send;
    received += n_recv;
  } while (sent < send_bytes || received < recv_bytes);
  return Status::OK();
}

}  // namespace tfring
