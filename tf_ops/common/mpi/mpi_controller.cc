#include "mpi_controller.h"

#include <limits>

namespace tfring {

MPIController::MPIController(std::shared_ptr<MPICommunicator> comm, std::vector<int> global_ranks,
                             const Config& config)
    : Controller(comm->rank(), std::move(global_ranks), config), comm_(std::move(comm)) {}

Status MPIController::GatherRequests(const std::string& mine, std::vector<std::string>* all) {
  if (mine.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return Status::InvalidArgument("tfring: too many tensors submitted in one cycle");
  }
  const int n = comm_->size();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(is_coordinator() ? n : 0);
  MPI_Request req;
  TFRING_RETURN_IF_ERROR(MPIStatus(
      MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_->get(), &req), "Igather"));
  TFRING_RETURN_IF_ERROR(comm_->Wait(&req, "Igather of request sizes", false));
  std::vector<int> displs(lens.size(), 0);
  std::string flat;
  if (is_coordinator()) {
    int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      displs[r] = static_cast<int>(total);
      total += lens[r];
    }
    flat.resize(total);
  }
  TFRING_RETURN_IF_ERROR(MPIStatus(
      MPI_Igatherv(mine.data(), len, MPI_BYTE, &flat[0], lens.data(), displs.data(), MPI_BYTE, 0,
                   comm_->get(), &req),
      "Igatherv"));
  TFRING_RETURN_IF_ERROR(comm_->Wait(&req, "Igatherv of requests", false));
  if (is_coordinator()) {
    all->resize(n);
    for (int r = 0; r < n; ++r) (*all)[r] = flat.substr(displs[r], lens[r]);
  }
  return Status::OK();
}

Status MPIController::BroadcastResponses(std::string* bytes) {
  int64_t len = static_cast<int64_t>(bytes->size());
  MPI_Request req;
  TFRING_RETURN_IF_ERROR(
      MPIStatus(MPI_Ibcast(&len, 1, MPI_INT64_T, 0, comm_->get(), &req), "Ibcast"));
  TFRING_RETURN_IF_ERROR(comm_->Wait(&req, "Ibcast of response size", false));
  bytes->resize(len);
  TFRING_RETURN_IF_ERROR(MPIStatus(
      MPI_Ibcast(&(*bytes)[0], static_cast<int>(len), MPI_BYTE, 0, comm_->get(), &req), "Ibcast"));
  return comm_->Wait(&req, "Ibcast of responses", false);
}

Status MPIController::AllreduceBitsAnd(std::vector<uint64_t>* words) {
  MPI_Request req;
  TFRING_RETURN_IF_ERROR(MPIStatus(MPI_Iallreduce(MPI_IN_PLACE, words->data(),
                                                  static_cast<int>(words->size()), MPI_UINT64_T,
                                                  MPI_BAND, comm_->get(), &req),
                                   "Iallreduce"));
  return comm_->Wait(&req, "Iallreduce of cache bits", false);
}

}  // namespace tfring
