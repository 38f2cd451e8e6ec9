// Adasum (adaptive summation, Maleki et al. 2020): instead of adding the
// gradients of two ranks, combine them as
//
//     a' = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
//
// which is their sum when they are orthogonal and their average when they
// are parallel: parallel gradients carry the same information and would
// otherwise count twice. Over 2^k ranks the pairs are combined as a binary
// tree (rank r with r ^ 1, then those pairs with the pairs at distance 2, and
// so on), computed by recursive vector halving with distance doubling: at
// each level a rank swaps half of its current slice with its partner and
// combines the half it keeps, so each rank moves about twice the buffer in
// total, like a ring allreduce. The dot products are per tensor: in a fused
// buffer each tensor is combined with its own coefficients.
//
// The algorithm only needs a pairwise exchange of bytes (PointToPoint);
// CommPointToPoint (ops/comm_point_to_point.h) provides one over any
// transport's Communicator, for the ring and the MPI data planes.
#ifndef TFRING_COMMON_OPS_ADASUM_H
#define TFRING_COMMON_OPS_ADASUM_H

#include <cstdint>
#include <vector>

#include "../common.h"
#include "../mapped_buffer.h"
#include "../status.h"

namespace tfring {

// A transport that can exchange bytes with one peer at a time.
class PointToPoint {
 public:
  virtual ~PointToPoint() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends `send_bytes` bytes to `peer` while receiving `recv_bytes` bytes
  // from it; returns when both are done. Both sides call it with each other.
  virtual Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                          int peer) = 0;
};

// True for the dtypes Adasum runs on (float16, float32, float64, as Horovod).
bool AdasumSupports(DataType dtype);

// Replaces `buffer` (tensors of counts[i] elements back to back, the same
// layout on every rank) with the Adasum of every rank's buffer; every rank
// ends with the same bits. Needs a power-of-two number of ranks. `scratch`
// is reused between calls.
Status AdasumAllreduce(PointToPoint* p2p, void* buffer, const std::vector<int64_t>& counts,
                       DataType dtype, MappedBuffer* scratch);

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_ADASUM_H
