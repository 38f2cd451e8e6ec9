// Negotiation over MPI: a gather of every rank's requests to the coordinator
// and a broadcast of its answer, using non-blocking calls so that an idle
// rank sleeps instead of spinning.
#ifndef TFRING_COMMON_MPI_MPI_CONTROLLER_H
#define TFRING_COMMON_MPI_MPI_CONTROLLER_H

#include <memory>

#include "../controller.h"
#include "mpi_context.h"

namespace tfring {

class MPIController : public Controller {
 public:
  MPIController(std::shared_ptr<MPICommunicator> comm, std::vector<int> global_ranks,
                const Config& config);

 protected:
  Status GatherRequests(const std::string& mine, std::vector<std::string>* all) override;
  Status BroadcastResponses(std::string* bytes) override;
  Status AllreduceBitsAnd(std::vector<uint64_t>* words) override;

 private:
  std::shared_ptr<MPICommunicator> comm_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_MPI_MPI_CONTROLLER_H
