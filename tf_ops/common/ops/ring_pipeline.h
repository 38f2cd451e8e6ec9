// The ring's transport plumbing, shared by the ring data plane's collectives
// (ring_data_plane.cc): a pipelined ring of point-to-point messages over a
// communicator, the pieces it moves, and the tags, waits and clean-up of its
// messages. The plane decides what travels (its schedules: which block at
// which step, from where, into where, reduced how); RingPipeline moves it.
#ifndef TFRING_COMMON_OPS_RING_PIPELINE_H
#define TFRING_COMMON_OPS_RING_PIPELINE_H

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "../mapped_buffer.h"
#include "../transport/communicator.h"

namespace tfring {
namespace ring_internal {

// One tag range per collective, one tag per step within it, all below
// kCollectiveTagBase (BarrierP2P's) and within the 32767 every transport
// allows. Messages of one collective between two ranks also match in order,
// so the tags are a safety net and a help when reading traces.
enum TagKind {
  kAllreduceTag = 1,
  kAllgatherTag = 2,
  kBroadcastTag = 3,
  kReducescatterTag = 4,
  kAlltoallTag = 5,
  kAdasumTag = 6,
  kAlgorithmsTag = 7  // AllreduceAlgorithms: tags 7 * 4096 + 0..1023
};
inline int Tag(TagKind kind, int step) { return kind * 4096 + (step & 4095); }

// A piece of a block: byte offset within the block and length in bytes.
struct Piece {
  int64_t off;
  int64_t len;
};

inline int Mod(int64_t a, int n) { return static_cast<int>(((a % n) + n) % n); }

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes per piece for a message of `total_bytes` split into `blocks` blocks,
// a multiple of `esize`: `segment_bytes` if positive (RingOptions), else
// chosen by message size.
int64_t PieceBytes(int64_t total_bytes, int blocks, int64_t esize, int64_t segment_bytes);

// `elems` elements of `esize` bytes as `nseg` pieces whose sizes differ by
// at most one element.
void SplitEven(int64_t elems, int64_t esize, int64_t nseg, std::vector<Piece>* out);

// Splits `elems` into pieces of at most `piece_bytes` (no pieces when empty).
void SplitBySize(int64_t elems, int64_t esize, int64_t piece_bytes, std::vector<Piece>* out);

// Asks for transparent huge pages on a large, freshly allocated output
// (see ring_pipeline.cc). Advice only.
void AdviseHugePages(void* data, int64_t bytes);

// Gives up on requests left behind by a failed collective. Receives go
// first so that a late message cannot land in memory the caller reuses.
void Abandon(Communicator& comm, std::vector<CommRequestPtr>* recvs,
             std::vector<CommRequestPtr>* sends);

// Waits for a ring message (see ring_pipeline.cc for how it waits); resets
// `req` once it has completed.
Status WaitFor(Communicator& comm, CommRequestPtr* req, const char* what);

// One ring collective: `steps` steps; at step s this rank sends block
// send_block(s) to the right and receives block recv_block(s) from the
// left, piece by piece. recv_block(s) must equal send_block(s + 1): piece k
// of step s+1 is sent as soon as piece k of step s has been received (and
// processed by on_recv).
struct RingPlan {
  int steps = 0;
  TagKind tag = kAllreduceTag;
  const std::vector<std::vector<Piece>>* pieces = nullptr;  // per block
  std::function<int(int)> send_block, recv_block;
  // Where block b lives for the send of step s.
  std::function<const char*(int s, int b)> send_base;
  // Where block b is received at step s; nullptr: into a scratch slot of
  // slot_bytes, handed to on_recv.
  std::function<char*(int s, int b)> recv_base;
  int64_t slot_bytes = 0;
  // Called when a piece has arrived, with where it landed. May be empty.
  std::function<Status(int s, int b, const Piece& piece, char* data)> on_recv;
  // Upper bound of the receive window (see the ring allreduce).
  int max_window = std::numeric_limits<int>::max();
};

// Runs ring plans over one communicator, keeping the receive slots between
// collectives. `window` receives are kept posted ahead (0: the default).
class RingPipeline {
 public:
  RingPipeline(std::shared_ptr<Communicator> comm, int window);

  Status Run(const RingPlan& plan);

 private:
  std::shared_ptr<Communicator> comm_;
  int window_;
  MappedBuffer slots_;  // receive slots of a plan without recv_base
};

}  // namespace ring_internal
}  // namespace tfring

#endif  // TFRING_COMMON_OPS_RING_PIPELINE_H
