// The MPI data plane: each collective maps to the matching non-blocking MPI
// collective on the process set's communicator, waited for with polling so
// that a dead peer ends the wait with an error instead of a hang.
#ifndef TFRING_COMMON_OPS_MPI_DATA_PLANE_H
#define TFRING_COMMON_OPS_MPI_DATA_PLANE_H

#include <memory>

#include "../mpi/mpi_context.h"
#include "adasum.h"
#include "data_plane.h"

namespace tfring {

class MPIDataPlane : public DataPlane {
 public:
  explicit MPIDataPlane(std::shared_ptr<MPICommunicator> comm) : comm_(std::move(comm)) {}
  const char* name() const override { return "MPI"; }
  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgather(const void* send, void* recv, const std::vector<int64_t>& recv_bytes) override;
  Status Broadcast(void* buffer, int64_t bytes, int root) override;
  Status Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes) override;
  Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  Status Barrier() override;
  Status Adasum(void* buffer, const std::vector<int64_t>& counts, DataType dtype) override;

 private:
  std::shared_ptr<MPICommunicator> comm_;
  // Adasum's pairwise exchanges, on a private duplicate of comm_ made at the
  // first Adasum (every rank of the set runs it in the same order).
  std::unique_ptr<PointToPoint> adasum_p2p_;
  MappedBuffer adasum_scratch_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_MPI_DATA_PLANE_H
