// The seam between the core and the transports: what a communication
// backend provides. The core (lifecycle.cc) starts one and asks it for each
// process set's controller and data plane; the assembly room (backends/,
// and mpi/ for MPI) implements it by joining a transport with the core's
// pieces. The operations and the kernels never learn which one runs.
#ifndef TFRING_COMMON_BACKEND_H
#define TFRING_COMMON_BACKEND_H

#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "status.h"

namespace tfring {

class PeerMonitor;
struct ProcessSet;

// What a communication backend (a transport: MPI, TCP) provides: a way to
// build a process set's controller and data plane.
class Backend {
 public:
  virtual ~Backend() = default;
  // "mpi" or "tcp": for messages and logs.
  virtual const char* name() const = 0;
  // Whether init() may run again in this process after this backend's
  // communication broke (a peer died, a link failed). MPI cannot: its
  // failures are fatal to the whole job. A transport that can tear down and
  // rebuild its connections (elastic training needs it) says yes.
  virtual bool can_restart_after_failure() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective over all ranks of the job. Fills `set`'s controller and data
  // plane (left null when this rank is not in `set->ranks`).
  virtual Status CreateProcessSet(ProcessSet* set, const Config& config) = 0;
  virtual bool threads_supported() const = 0;
  // Lets waits give up when a peer process dies (see PeerMonitor).
  virtual void set_peer_monitor(std::shared_ptr<PeerMonitor> monitor) = 0;
  // The host of every job-wide rank; sets created afterwards can use
  // shared memory within a host. Until then sets use the fallback plane only
  // (see ops/data_plane_factory.h).
  virtual void set_hosts(std::vector<std::string> hosts) = 0;
};

}  // namespace tfring

#endif  // TFRING_COMMON_BACKEND_H
