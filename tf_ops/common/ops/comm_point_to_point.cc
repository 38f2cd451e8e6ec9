#include "comm_point_to_point.h"

#include <vector>

namespace tfring {

Status CommPointToPoint::SendRecv(const void* send, int64_t send_bytes, void* recv,
                                  int64_t recv_bytes, int peer) {
  // The receive goes first so that the peer's message finds it posted.
  std::vector<CommRequestPtr> reqs(2);
  TFRING_RETURN_IF_ERROR(comm_->Irecv(recv, recv_bytes, peer, tag_, &reqs[0]));
  Status s = comm_->Isend(send, send_bytes, peer, tag_, &reqs[1]);
  if (!s.ok()) {
    comm_->Cancel(&reqs[0]);
    return s;
  }
  // Data movement: keep polling (a transport may progress only inside Test).
  return comm_->WaitAll(&reqs, "pairwise exchange", true);
}

}  // namespace tfring
