// Allreduce algorithms beside the ring, over point-to-point messages
// (transport/communicator.h) so that every transport gets them, and the
// alpha-beta-gamma model that chooses among them and the ring.
//
// The ring (ring_data_plane.cc) moves the least data, 2(p-1)/p of the
// buffer per rank, but pays 2(p-1) hops: at small sizes the hops are the
// cost. Recursive doubling pays ceil(log2 p) hops and moves the whole buffer
// at each; Rabenseifner's reduce-scatter by recursive halving and allgather
// by recursive doubling pays 2 log2 p hops and moves what the ring moves.
// A non-power-of-two p is folded to the largest power of two p' below it
// first (MPICH's way): of the first 2(p-p') ranks, each even one hands its
// buffer to the odd one above it, sits out, and gets the result back at the
// end: two more hops of the whole buffer.
//
// Both give every rank the same bits: each pairwise combination is computed
// as (lower rank's side) op (higher rank's side) on both ranks that compute
// it, and Rabenseifner reduces each block on one rank only. The bits differ
// from the ring's for floating point sums and products, whose order they
// change (the ring adds a block in ring order starting at its owner).
#ifndef TFRING_COMMON_OPS_ALLREDUCE_ALGORITHMS_H
#define TFRING_COMMON_OPS_ALLREDUCE_ALGORITHMS_H

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "../common.h"
#include "../mapped_buffer.h"
#include "../config.h"
#include "../status.h"
#include "../transport/communicator.h"

namespace tfring {

// The costs of one set's links, in seconds: the Hockney model (a message of
// n bytes from one rank to the next costs alpha + n * beta; reducing n
// bytes into a buffer costs n * gamma) with a message's first short_bytes
// at short_beta each. A link often passes a short message faster per byte
// than a long one's bytes: a token bucket's burst, a TCP window still open.
// Priced at the long messages' beta, a 4 KB message cost as much as 4 KB at
// line rate, so the model preferred the ring's many small hops to recursive
// doubling's few, where the measured times said the opposite.
struct LinkCosts {
  double alpha = 0;
  double beta = 0;
  double gamma = 0;
  int64_t short_bytes = 0;  // 0: beta throughout
  double short_beta = 0;

  // One message of `bytes` from one rank to the next.
  double Hop(double bytes) const {
    const double head = std::min(bytes, static_cast<double>(short_bytes));
    return alpha + head * short_beta + (bytes - head) * beta;
  }
};

// The model's time for `algorithm` (not AUTO) over `ranks` ranks and
// `bytes` bytes. The ring overlaps each piece's reduction with the next
// piece's transfer (its pipeline); the others reduce a whole message after
// it has arrived.
double PredictAllreduceSeconds(AllreduceAlgorithm algorithm, int ranks, int64_t bytes,
                               const LinkCosts& costs);
// The algorithm the model predicts fastest (the ring on a tie).
AllreduceAlgorithm ChooseAllreduceAlgorithm(int ranks, int64_t bytes, const LinkCosts& costs);

// Recursive doubling and Rabenseifner on one communicator, with tags from
// `tag_base` to tag_base + 1023 to themselves. Inputs and outputs as for
// DataPlane::Allreduce; `op` is SUM, MIN, MAX or PRODUCT. Collective:
// every rank calls the same algorithm with the same count.
class AllreduceAlgorithms {
 public:
  AllreduceAlgorithms(std::shared_ptr<Communicator> comm, int tag_base)
      : comm_(std::move(comm)), tag_base_(tag_base) {}

  Status RecursiveDoubling(const void* input, void* output, int64_t count, DataType dtype,
                           ReduceOp op);
  Status Rabenseifner(const void* input, void* output, int64_t count, DataType dtype,
                      ReduceOp op);
  // Measures this set's link costs (collective): alpha and short_beta from
  // a tiny and a short token passed round the ring (rank 0 times them),
  // beta from a large ring hop (every rank sends right at once), gamma from
  // a local reduction; every rank then gets the largest of each over the
  // ranks, so all choose alike.
  Status MeasureLinkCosts(LinkCosts* out);

 private:
  // Where this rank stands after the fold: its rank among the p' ranks that
  // run the butterfly, or -1 when it handed its buffer on.
  struct Fold {
    int pow2 = 1;   // p'
    int extra = 0;  // p - p'
    int vrank = -1;
  };
  int RealRank(const Fold& f, int vrank) const {
    return vrank < f.extra ? 2 * vrank + 1 : vrank + f.extra;
  }
  // One rank, or nothing to reduce: copies `in` to `out` (`bytes` of it)
  // and returns true; the algorithm has nothing else to do.
  bool Alone(const char* in, char* out, int64_t bytes);
  // The fold: `*cur` becomes the output when this rank reduced a partner's
  // buffer into it.
  Status FoldIn(const char* in, char* out, int64_t count, DataType dtype, ReduceOp op, Fold* f,
                const char** cur);
  // The result back to the rank that sat out.
  Status FoldOut(const Fold& f, char* out, int64_t bytes);
  // One round of a `bytes` token from rank 0 round the ring and back to it.
  Status PassToken(char* send, char* recv, int64_t bytes, int left, int right, int tag);
  // Sends `send` to `to` while receiving from `from` (either may be null:
  // nothing that way) and waits for both; cancels both on failure.
  Status SendRecv(const void* send, int64_t send_bytes, int to, void* recv, int64_t recv_bytes,
                  int from, int tag, const char* what);
  Status Exchange(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes, int peer,
                  int tag);
  // dst = (lower rank's side) op (higher rank's side).
  Status Combine(char* dst, const char* mine, const char* theirs, bool mine_lower, int64_t count,
                 DataType dtype, ReduceOp op);
  int Tag(int step) const { return tag_base_ + step; }

  std::shared_ptr<Communicator> comm_;
  int tag_base_;
  MappedBuffer scratch_;            // what a partner sent
  std::vector<int64_t> off_, len_;  // Rabenseifner's blocks (elements)
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_ALLREDUCE_ALGORITHMS_H
