// MPI as one implementation of the transport seam (transport/communicator.h):
// an owned MPI communicator whose point-to-point messages, splits and
// duplicates serve the ring, hierarchical and shared-memory set-up code like
// any other transport's. The MPI controller and the MPI data plane also use
// it for MPI's own non-blocking collectives (Wait on an MPI_Request).
#ifndef TFRING_COMMON_MPI_MPI_COMMUNICATOR_H
#define TFRING_COMMON_MPI_MPI_COMMUNICATOR_H

#include <mpi.h>

#include <memory>

#include "../peer_monitor.h"
#include "../status.h"
#include "../transport/communicator.h"

namespace tfring {

// Owns one MPI communicator (errors returned, not fatal); frees it when the
// last user lets go. MPI makes progress only inside MPI calls, which Test()
// is, so the base class's polling waits serve MPI as they are.
class MPICommunicator : public Communicator {
 public:
  explicit MPICommunicator(MPI_Comm comm, std::shared_ptr<PeerMonitor> monitor = nullptr);
  ~MPICommunicator() override;
  MPICommunicator(const MPICommunicator&) = delete;
  MPICommunicator& operator=(const MPICommunicator&) = delete;

  MPI_Comm get() const { return comm_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* transport() const override { return "MPI"; }
  int max_tag() const override { return max_tag_; }

  Status Isend(const void* buf, int64_t bytes, int peer, int tag, CommRequestPtr* out) override;
  Status Irecv(void* buf, int64_t bytes, int peer, int tag, CommRequestPtr* out) override;
  Status Test(CommRequest* req, bool* done) override;
  void Cancel(CommRequestPtr* req) override;
  Status Split(int color, int key, std::shared_ptr<Communicator>* out) override;
  Status Dup(std::shared_ptr<Communicator>* out) override;

  using Communicator::Wait;
  // Waits for one of MPI's own non-blocking operations (a collective) on
  // this communicator, like Wait above: a dead peer ends it. On error the
  // request is left as it is (a pending collective cannot be cancelled).
  Status Wait(MPI_Request* request, const char* what, bool spin);

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 0;
  int max_tag_ = 32767;
};

Status MPIStatus(int code, const char* what);

}  // namespace tfring

#endif  // TFRING_COMMON_MPI_MPI_COMMUNICATOR_H
