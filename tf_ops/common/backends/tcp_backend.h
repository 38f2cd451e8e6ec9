// The TCP backend (the assembly room, backends/: a transport joined with the
// core): tfring without MPI. Ranks find each other through the
// rendezvous store (docs/wire.md), connect a full mesh of authenticated TCP
// connections (tcp_communicator.h), and run negotiation (P2PController) and
// collectives (the planes chosen by ops/data_plane_factory.h) over it.
// Unlike MPI it can start again in the same process after a failure, which
// elastic training needs.
#ifndef TFRING_COMMON_BACKENDS_TCP_BACKEND_H
#define TFRING_COMMON_BACKENDS_TCP_BACKEND_H

#include <memory>
#include <string>
#include <vector>

#include "../backend.h"
#include "../config.h"
#include "../process_set.h"
#include "../transport/communicator.h"

namespace tfring {

class TcpBackend : public Backend {
 public:
  // Registers with the store named by `config`, waits for all
  // `config.size` ranks and connects to them, all within
  // config.start_timeout_s. PRECONDITION_ERROR names a missing or bad
  // setting; ABORTED a store or peer that cannot be reached.
  static Status Create(const Config& config, std::unique_ptr<TcpBackend>* out);

  const char* name() const override { return "tcp"; }
  bool can_restart_after_failure() const override { return true; }
  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }
  Status CreateProcessSet(ProcessSet* set, const Config& config) override;
  bool threads_supported() const override { return true; }
  void set_peer_monitor(std::shared_ptr<PeerMonitor> monitor) override {
    // The monitor's ranks are job-wide, as the world communicator's are. A
    // weak pointer: the world owns the monitor.
    std::weak_ptr<Communicator> world = world_;
    monitor->set_on_death([world](int rank) {
      if (auto w = world.lock()) w->PeerProcessExited(rank);
    });
    monitor->set_transport_probe([world]() {
      auto w = world.lock();
      return w ? w->TransportFailure() : Status::OK();
    });
    world_->set_monitor(std::move(monitor));
  }
  void set_hosts(std::vector<std::string> hosts) override { hosts_ = std::move(hosts); }

 private:
  std::shared_ptr<Communicator> world_;
  std::vector<std::string> hosts_;  // by job-wide rank; empty until topology is known
};

}  // namespace tfring

#endif  // TFRING_COMMON_BACKENDS_TCP_BACKEND_H
