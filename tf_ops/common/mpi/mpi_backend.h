// The MPI backend: duplicates the communicator the job was started with and
// splits it for each process set.
#ifndef TFRING_COMMON_MPI_MPI_BACKEND_H
#define TFRING_COMMON_MPI_MPI_BACKEND_H

#include <memory>

#include "../backend.h"
#include "../process_set.h"
#include "mpi_communicator.h"

namespace tfring {

class MPIBackend : public Backend {
 public:
  // `base` is the communicator from the user (MPI_COMM_WORLD by default).
  static Status Create(MPI_Comm base, std::unique_ptr<MPIBackend>* out);
  ~MPIBackend() override;

  const char* name() const override { return "mpi"; }
  // MPI's errors are fatal to the job: after one, MPI cannot be trusted to
  // create communicators again (it may hang), so init() must not retry.
  bool can_restart_after_failure() const override { return false; }
  int rank() const override { return global_->rank(); }
  int size() const override { return global_->size(); }
  Status CreateProcessSet(ProcessSet* set, const Config& config) override;
  bool threads_supported() const override { return threads_supported_; }
  void set_peer_monitor(std::shared_ptr<PeerMonitor> monitor) override {
    global_->set_monitor(std::move(monitor));
  }
  void set_hosts(std::vector<std::string> hosts) override { hosts_ = std::move(hosts); }

 private:
  std::shared_ptr<MPICommunicator> global_;
  std::vector<std::string> hosts_;  // by job-wide rank; empty until topology is known
  bool threads_supported_ = false;
};

}  // namespace tfring

#endif  // TFRING_COMMON_MPI_MPI_BACKEND_H
