// Pairwise exchanges over MPI point-to-point messages, for algorithms that
// need only those (Adasum). Waits poll the communicator's peer monitor, so a
// dead peer ends an exchange with an error instead of a hang.
#ifndef TFRING_COMMON_MPI_MPI_POINT_TO_POINT_H
#define TFRING_COMMON_MPI_MPI_POINT_TO_POINT_H

#include <memory>

#include "../ops/adasum.h"
#include "mpi_context.h"

namespace tfring {

class MPIPointToPoint : public PointToPoint {
 public:
  // `comm` must be private to this object: messages are matched by tag only.
  explicit MPIPointToPoint(std::shared_ptr<MPICommunicator> comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                  int peer) override;

 private:
  std::shared_ptr<MPICommunicator> comm_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_MPI_MPI_POINT_TO_POINT_H
