// Negotiation over any Communicator's point-to-point messages: every rank
// sends its requests to the coordinator, which answers each rank. The TCP
// backend uses it; MPI keeps its own controller, which uses MPI's
// collectives. The messages are the same either way (message.h), and so
// are the decisions and the errors (controller.h).
#ifndef TFRING_COMMON_BACKENDS_P2P_CONTROLLER_H
#define TFRING_COMMON_BACKENDS_P2P_CONTROLLER_H

#include <memory>

#include "../controller.h"
#include "../transport/communicator.h"

namespace tfring {

class P2PController : public Controller {
 public:
  // `comm` must be private to this controller (a Dup): its tags are reused
  // every cycle.
  P2PController(std::shared_ptr<Communicator> comm, std::vector<int> global_ranks,
                const Config& config)
      : Controller(comm->rank(), std::move(global_ranks), config), comm_(std::move(comm)) {}

 protected:
  Status GatherRequests(const std::string& mine, std::vector<std::string>* all) override {
    return GatherBytes(*comm_, mine, all);
  }
  Status BroadcastResponses(std::string* bytes) override { return BroadcastBytes(*comm_, bytes); }
  Status AllreduceBitsAnd(std::vector<uint64_t>* words) override {
    return ::tfring::AllreduceBitsAnd(*comm_, words);
  }

 private:
  std::shared_ptr<Communicator> comm_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_BACKENDS_P2P_CONTROLLER_H
