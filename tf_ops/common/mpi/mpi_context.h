// MPI plumbing shared by the MPI controller and data plane: communicators
// with errors returned rather than fatal, dtype and reduce-op mapping
// (float16/bfloat16 get user-defined ops), and a wait that yields the CPU.
#ifndef TFRING_COMMON_MPI_MPI_CONTEXT_H
#define TFRING_COMMON_MPI_MPI_CONTEXT_H

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "../common.h"
#include "../peer_monitor.h"
#include "../status.h"
#include "../transport/communicator.h"

namespace tfring {

// Owns one MPI communicator; frees it when the last user lets go. Carries
// the peer monitor that lets a wait on it give up when a peer has died.
class MPICommunicator {
 public:
  explicit MPICommunicator(MPI_Comm comm, std::shared_ptr<PeerMonitor> monitor = nullptr);
  ~MPICommunicator();
  MPICommunicator(const MPICommunicator&) = delete;
  MPICommunicator& operator=(const MPICommunicator&) = delete;
  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::shared_ptr<PeerMonitor>& monitor() const { return monitor_; }
  void set_monitor(std::shared_ptr<PeerMonitor> m) { monitor_ = std::move(m); }

  // Waits for a non-blocking operation on this communicator. Negotiation
  // (`spin` false) sleeps with backoff between polls so an idle rank does not
  // burn a core; data movement (`spin` true) keeps polling, because MPI only
  // makes progress inside MPI calls. Either way a dead peer ends the wait.
  Status Wait(MPI_Request* request, const char* what, bool spin) const;

 private:
  MPI_Comm comm_;
  std::shared_ptr<PeerMonitor> monitor_;
  int rank_ = 0;
  int size_ = 0;
};

Status MPIStatus(int code, const char* what);

// The MPI datatype for `dtype` (a 2-byte opaque type for float16/bfloat16).
MPI_Datatype MPIDataType(DataType dtype);
// The MPI op for (`dtype`, `op`); float16/bfloat16 and bool map to our own.
Status MPIReduceOp(DataType dtype, ReduceOp op, MPI_Op* out);

// Creates the user-defined types and ops; call once after MPI is initialised.
Status InitMPITypes();
void FreeMPITypes();

}  // namespace tfring

#endif  // TFRING_COMMON_MPI_MPI_CONTEXT_H
