// The pairwise exchange Adasum needs (ops/adasum.h), over any transport's
// point-to-point messages.
#ifndef TFRING_COMMON_OPS_COMM_POINT_TO_POINT_H
#define TFRING_COMMON_OPS_COMM_POINT_TO_POINT_H

#include <memory>

#include "../transport/communicator.h"
#include "adasum.h"

namespace tfring {

class CommPointToPoint : public PointToPoint {
 public:
  // Messages are matched by `tag` alone: nothing else may use that tag on
  // `comm` while an exchange runs.
  CommPointToPoint(std::shared_ptr<Communicator> comm, int tag)
      : comm_(std::move(comm)), tag_(tag) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                  int peer) override;

 private:
  std::shared_ptr<Communicator> comm_;
  int tag_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_COMM_POINT_TO_POINT_H
