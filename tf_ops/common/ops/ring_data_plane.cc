// The ring data plane: collectives as rings of point-to-point messages
// (transport/communicator.h) on a private duplicate of the set's
// communicator, whatever the transport underneath.
//
// Allreduce over n ranks cuts the buffer into n blocks and runs 2(n-1) steps.
// At step s rank r sends block (r - s) mod n to its right neighbour and
// receives block (r - s - 1) mod n from its left one: the first n-1 steps
// reduce what arrives into the block (scatter-reduce; afterwards rank r holds
// block r+1 fully reduced), the last n-1 steps store it (allgather). Each rank
// sends and receives 2(n-1)/n of the buffer whatever n is, which is the least
// any allreduce can move, and every block is reduced on exactly one rank, so
// all ranks end with bit-identical results.
//
// Every block is cut further into pieces, and the steps are pipelined piece
// by piece rather than step by step: as soon as piece k of step s has arrived
// and been reduced, piece k of step s+1 is on its way to the right neighbour,
// while pieces k+1.. of step s are still arriving. A few receives are kept
// posted ahead (`window`), so the transfer of one piece overlaps the
// reduction of the one before it.
//
// Allgather and reducescatter are the two halves of that ring (reducescatter
// shifted by one block so that rank r ends with block r, and with uneven
// blocks), and broadcast is a pipelined chain from the root. Alltoall is a
// pairwise exchange (every rank sends each peer its block directly: there is
// nothing to pipeline or reduce), barrier is BarrierP2P, and Adasum runs its
// recursive halving over pairwise exchanges (CommPointToPoint), each with a
// tag of its own on the same private communicator. Every wait is the
// communicator's, which polls the transport and the set's peer monitor, so a
// peer that dies ends the collective with an error instead of a hang.
#include "ring_data_plane.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include "../logging.h"
#include "../reduction.h"
#include "allreduce_algorithms.h"
#include "comm_point_to_point.h"

namespace tfring {
namespace ring_internal {
namespace {

// Piece sizes chosen by message size: about kPiecesPerBlock pieces per block
// (enough to overlap transfer and reduction), never so small that per-message
// cost dominates, never so large that a piece stops fitting in cache. A sweep
// of segment sizes 64 KiB..4 MiB and windows 2..8 (with the MPI ring test's
// former --bench mode) on the 2-core dev machine showed no setting clearly
// better than these; the differences were within that machine's noise.
constexpr int64_t kMinPieceBytes = 64 << 10;
constexpr int64_t kMaxPieceBytes = 1 << 20;
constexpr int64_t kPiecesPerBlock = 4;
constexpr int kDefaultWindow = 4;

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
int Tag(TagKind kind, int step) { return kind * 4096 + (step & 4095); }

// A piece of a block: byte offset within the block and length in bytes.
struct Piece {
  int64_t off;
  int64_t len;
};

int Mod(int64_t a, int n) { return static_cast<int>(((a % n) + n) % n); }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes per piece for a message of `total_bytes` split into `blocks` blocks,
// a multiple of `esize`.
int64_t PieceBytes(int64_t total_bytes, int blocks, int64_t esize, const RingOptions& opt) {
  int64_t piece = opt.segment_bytes;
  if (piece <= 0) {
    piece = std::min(kMaxPieceBytes,
                     std::max(kMinPieceBytes, total_bytes / blocks / kPiecesPerBlock));
  }
  return std::max(esize, piece / esize * esize);
}

// `elems` elements of `esize` bytes as `nseg` pieces whose sizes differ by
// at most one element.
void SplitEven(int64_t elems, int64_t esize, int64_t nseg, std::vector<Piece>* out) {
  out->clear();
  out->reserve(nseg);
  for (int64_t k = 0; k < nseg; ++k) {
    const int64_t b = elems / nseg * k + std::min(k, elems % nseg);
    const int64_t len = elems / nseg + (k < elems % nseg ? 1 : 0);
    out->push_back({b * esize, len * esize});
  }
}

// Splits `elems` into pieces of at most `piece_bytes` (no pieces when empty).
void SplitBySize(int64_t elems, int64_t esize, int64_t piece_bytes, std::vector<Piece>* out) {
  SplitEven(elems, esize, CeilDiv(elems * esize, piece_bytes), out);
}

// A result the framework has just allocated is faulted in page by page as
// the ring first writes it: TensorFlow's CPU allocator takes a 64 MB output
// straight from mmap and gives it back after the step, so every call pays
// 16384 faults of 4 KiB pages. On the 2-core development VM that first touch
// cost 151 ms of CPU per 64 MB (29.5 ms with 2 MiB pages), more than the TCP
// copies of the data, and across hosts it was what kept a TF allreduce off
// the link where the CPUs bind (benchmarks/RESULTS_CROSS_HOST.md). Asking
// for transparent huge pages on the output's 2 MiB-aligned interior makes
// that 32 faults where the kernel allows THP on request (its common
// "madvise" setting); on memory already touched the advice only takes effect
// if khugepaged later collapses it, and where THP is off it does nothing.
constexpr int64_t kHugePageAdviceMinBytes = 8 << 20;
constexpr uintptr_t kHugePage = 2u << 20;

void AdviseHugePages(void* data, int64_t bytes) {
  if (bytes < kHugePageAdviceMinBytes) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + uintptr_t(bytes)) & ~(kHugePage - 1);
  // Advice only: memory that cannot take it (not anonymous, THP off) is
  // used as it is.
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

Status CheckReduceOp(ReduceOp op, const char* what) {
  if (op == ReduceOp::SUM || op == ReduceOp::MIN || op == ReduceOp::MAX ||
      op == ReduceOp::PRODUCT) {
    return Status::OK();
  }
  return Status::InvalidArgument(std::string("tfring: the ring data plane cannot run ") + what +
                                 " with reduce op " + ReduceOpName(op));
}

// Gives up on requests left behind by a failed collective. Receives go
// first so that a late message cannot land in memory the caller reuses.
void Abandon(Communicator& comm, std::vector<CommRequestPtr>* recvs,
             std::vector<CommRequestPtr>* sends) {
  for (CommRequestPtr& req : *recvs) comm.Cancel(&req);
  for (CommRequestPtr& req : *sends) comm.Cancel(&req);
}

// Waits for a ring message. Data movement spins (a transport such as MPI
// progresses only inside Test), yielding the CPU between polls after a short
// spin: a ring moves many pieces, each a hand-off between two ranks, and when
// ranks outnumber cores a rank spinning through its whole time slice keeps
// the rank it waits for off the CPU (3 ranks on 2 cores ran the ring test
// about twice as slow without the yield). With a core per rank the yield
// returns at once.
Status WaitFor(Communicator& comm, CommRequestPtr* req, const char* what) {
  Status s = comm.Wait(req->get(), what, true);
  if (s.ok()) req->reset();
  return s;
}

class RingDataPlane : public DataPlane {
 public:
  RingDataPlane(std::shared_ptr<Communicator> comm, const RingOptions& opt)
      : comm_(std::move(comm)), adasum_p2p_(comm_, Tag(kAdasumTag, 0)),
        algorithms_(comm_, Tag(kAlgorithmsTag, 0)), opt_(opt),
        window_(opt.window > 0 ? opt.window : kDefaultWindow) {}

  const char* name() const override { return "ring"; }

  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgather(const void* send, void* recv, const std::vector<int64_t>& recv_bytes) override;
  Status Broadcast(void* buffer, int64_t bytes, int root) override;
  Status Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes) override;
  Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  // A barrier can wait long on a slow rank: BarrierP2P's waits sleep.
  Status Barrier() override { return BarrierP2P(*comm_); }
  Status Adasum(void* buffer, const std::vector<int64_t>& counts, DataType dtype) override {
    return AdasumAllreduce(&adasum_p2p_, buffer, counts, dtype, &adasum_scratch_);
  }

 private:
  // One ring collective: `steps` steps; at step s this rank sends block
  // send_block(s) to the right and receives block recv_block(s) from the
  // left, piece by piece. recv_block(s) must equal send_block(s + 1): piece k
  // of step s+1 is sent as soon as piece k of step s has been received (and
  // processed by on_recv).
  struct Plan {
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
    // Upper bound of the receive window (see Allreduce).
    int max_window = std::numeric_limits<int>::max();
  };

  Status Run(const Plan& plan);
  Status RingAllreduce(const void* input, void* output, int64_t count, DataType dtype,
                       ReduceOp op);

  std::shared_ptr<Communicator> comm_;
  CommPointToPoint adasum_p2p_;
  AllreduceAlgorithms algorithms_;
  // AUTO's model inputs, measured at the first allreduce.
  bool costs_measured_ = false;
  LinkCosts costs_;
  std::vector<char> adasum_scratch_;
  RingOptions opt_;
  int window_;
  std::vector<char> slots_;  // receive slots of the scatter-reduce
  std::vector<char> work_;   // partial sums of the reducescatter
};

Status RingDataPlane::Run(const Plan& p) {
  const int n = comm_->size(), r = comm_->rank();
  const int right = Mod(r + 1, n), left = Mod(r - 1, n);
  const auto& pieces = *p.pieces;
  const int window = std::max(1, std::min(window_, p.max_window));

  struct Unit {
    int step;
    int k;
  };
  std::vector<Unit> units;  // every piece this rank receives, in order
  for (int s = 0; s < p.steps; ++s) {
    const int b = p.recv_block(s);
    for (int k = 0; k < static_cast<int>(pieces[b].size()); ++k) units.push_back({s, k});
  }
  if (p.slot_bytes > 0) {
    const size_t need = static_cast<size_t>(p.slot_bytes) * window;
    if (slots_.size() < need) slots_.resize(need);
  }
  std::vector<CommRequestPtr> recvs(units.size());
  std::vector<char*> landed(units.size(), nullptr);
  std::vector<CommRequestPtr> sends;
  sends.reserve(units.size() + (p.steps > 0 ? pieces[p.send_block(0)].size() : 0));
  // The latest send out of each piece of each block, so that no receive
  // (and no reduction) writes a piece of memory a pending send still reads.
  std::vector<std::vector<int>> last_send(pieces.size());
  for (size_t b = 0; b < pieces.size(); ++b) last_send[b].assign(pieces[b].size(), -1);

  auto settle = [&](int b, int k) -> Status {
    const int i = last_send[b][k];
    if (i < 0 || !sends[i]) return Status::OK();
    return WaitFor(*comm_, &sends[i], "ring send");
  };
  auto post_send = [&](int s, int k) -> Status {
    const int b = p.send_block(s);
    const Piece& pc = pieces[b][k];
    CommRequestPtr req;
    TFRING_RETURN_IF_ERROR(
        comm_->Isend(p.send_base(s, b) + pc.off, pc.len, right, Tag(p.tag, s), &req));
    last_send[b][k] = static_cast<int>(sends.size());
    sends.push_back(std::move(req));
    return Status::OK();
  };
  auto post_recv = [&](size_t u) -> Status {
    const Unit& un = units[u];
    const int b = p.recv_block(un.step);
    const Piece& pc = pieces[b][un.k];
    char* base = p.recv_base ? p.recv_base(un.step, b) : nullptr;
    char* dst;
    if (base != nullptr) {
      TFRING_RETURN_IF_ERROR(settle(b, un.k));
      dst = base + pc.off;
    } else {
      dst = slots_.data() + static_cast<int64_t>(u % window) * p.slot_bytes;
    }
    landed[u] = dst;
    return comm_->Irecv(dst, pc.len, left, Tag(p.tag, un.step), &recvs[u]);
  };
  auto body = [&]() -> Status {
    // Receives first, so the first pieces find them posted.
    for (size_t u = 0; u < units.size() && u < static_cast<size_t>(window); ++u) {
      TFRING_RETURN_IF_ERROR(post_recv(u));
    }
    if (p.steps > 0) {
      const int b0 = p.send_block(0);
      for (int k = 0; k < static_cast<int>(pieces[b0].size()); ++k) {
        TFRING_RETURN_IF_ERROR(post_send(0, k));
      }
    }
    for (size_t u = 0; u < units.size(); ++u) {
      TFRING_RETURN_IF_ERROR(WaitFor(*comm_, &recvs[u], "ring receive"));
      const Unit un = units[u];
      const int b = p.recv_block(un.step);
      if (p.on_recv) {
        TFRING_RETURN_IF_ERROR(settle(b, un.k));
        TFRING_RETURN_IF_ERROR(p.on_recv(un.step, b, pieces[b][un.k], landed[u]));
      }
      // Forward first (it never waits), then re-arm the window (which may
      // wait for an old send out of the memory it receives into).
      if (un.step + 1 < p.steps) TFRING_RETURN_IF_ERROR(post_send(un.step + 1, un.k));
      if (u + window < units.size()) TFRING_RETURN_IF_ERROR(post_recv(u + window));
    }
    for (CommRequestPtr& req : sends) {
      if (req) TFRING_RETURN_IF_ERROR(WaitFor(*comm_, &req, "ring send"));
    }
    return Status::OK();
  };
  Status s = body();
  if (!s.ok()) Abandon(*comm_, &recvs, &sends);
  return s;
}

Status RingDataPlane::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                                ReduceOp op) {
  TFRING_RETURN_IF_ERROR(CheckReduceOp(op, "allreduce"));
  const int n = comm_->size();
  if (count <= 0 || n == 1) return RingAllreduce(input, output, count, dtype, op);
  AllreduceAlgorithm algorithm = opt_.allreduce;
  if (algorithm == AllreduceAlgorithm::AUTO) {
    // Every rank of the set makes its first allreduce call together, so
    // the measurement (collective) happens at the same point on all.
    if (!costs_measured_) {
      TFRING_RETURN_IF_ERROR(algorithms_.MeasureLinkCosts(&costs_));
      costs_measured_ = true;
    }
    algorithm = ChooseAllreduceAlgorithm(n, count * DataTypeSize(dtype), costs_);
  }
  switch (algorithm) {
    case AllreduceAlgorithm::RECURSIVE_DOUBLING:
      return algorithms_.RecursiveDoubling(input, output, count, dtype, op);
    case AllreduceAlgorithm::RABENSEIFNER:
      return algorithms_.Rabenseifner(input, output, count, dtype, op);
    case AllreduceAlgorithm::AUTO:
    case AllreduceAlgorithm::RING:
      break;
  }
  return RingAllreduce(input, output, count, dtype, op);
}

Status RingDataPlane::RingAllreduce(const void* input, void* output, int64_t count,
                                    DataType dtype, ReduceOp op) {
  const int n = comm_->size(), r = comm_->rank();
  if (count <= 0) return Status::OK();
  const int64_t esize = DataTypeSize(dtype);
  const char* in = static_cast<const char*>(input);
  char* buf = static_cast<char*>(output);
  if (n == 1) {
    if (buf != in) std::memcpy(buf, in, count * esize);
    return Status::OK();
  }
  if (buf != in) AdviseHugePages(buf, count * esize);

  // Blocks of count/n elements (the first count % n one more); with fewer
  // elements than ranks some blocks are empty and their pieces are empty
  // messages, which keeps every rank's schedule the same.
  std::vector<int64_t> off(n), len(n);
  int64_t o = 0;
  for (int b = 0; b < n; ++b) {
    len[b] = count / n + (b < count % n ? 1 : 0);
    off[b] = o;
    o += len[b];
  }
  // The same number of pieces in every block: receives are then posted in
  // lock-step on all ranks, which the window bound below relies on.
  const int64_t max_len = len[0];
  const int64_t piece = PieceBytes(count * esize, n, esize, opt_);
  const int64_t nseg = std::max<int64_t>(1, CeilDiv(max_len * esize, piece));
  std::vector<std::vector<Piece>> pieces(n);
  for (int b = 0; b < n; ++b) SplitEven(len[b], esize, nseg, &pieces[b]);

  Plan plan;
  plan.steps = 2 * (n - 1);
  plan.tag = kAllreduceTag;
  plan.pieces = &pieces;
  plan.send_block = [&](int s) { return Mod(r - s, n); };
  plan.recv_block = [&](int s) { return Mod(r - s - 1, n); };
  // Out of place: step 0 sends this rank's own block, still untouched, from
  // the input; every later send is of a block reduced (or received) into
  // the output, so the input is never copied to the output.
  plan.send_base = [&](int s, int b) -> const char* {
    return (s == 0 ? in : buf) + off[b] * esize;
  };
  // Scatter-reduce steps receive into slots and reduce into the buffer; the
  // allgather steps receive straight into the buffer.
  plan.recv_base = [&](int s, int b) -> char* {
    return s < n - 1 ? nullptr : buf + off[b] * esize;
  };
  plan.slot_bytes = CeilDiv(max_len, nseg) * esize;
  plan.on_recv = [&](int s, int b, const Piece& pc, char* data) -> Status {
    if (s >= n - 1 || pc.len == 0) return Status::OK();
    // This rank's own share of block b is still only in the input: each
    // block reaches a rank once in these steps.
    const int64_t at = off[b] * esize + pc.off;
    return ReduceTo(buf + at, in + at, data, pc.len / esize, dtype, op);
  };
  // A block is reduced at step s and received again (final) at step s + n:
  // n * nseg receives later. Keeping the window within that distance means
  // the final receive into a piece is only posted after the piece has been
  // reduced and its send posted (the receive then waits for that send).
  plan.max_window = static_cast<int>(std::min<int64_t>(n * nseg, std::numeric_limits<int>::max()));
  TFRING_LOG(TRACE) << "ring allreduce: " << count << " x " << DataTypeName(dtype) << ", " << nseg
                    << " pieces per block";
  return Run(plan);
}

Status RingDataPlane::Allgather(const void* send, void* recv,
                                const std::vector<int64_t>& recv_bytes) {
  const int n = comm_->size(), r = comm_->rank();
  if (static_cast<int>(recv_bytes.size()) != n) {
    return Status::InvalidArgument("tfring: ring allgather got " +
                                   std::to_string(recv_bytes.size()) + " sizes for " +
                                   std::to_string(n) + " ranks");
  }
  char* out = static_cast<char*>(recv);
  std::vector<int64_t> off(n, 0);
  int64_t total = 0;
  for (int b = 0; b < n; ++b) {
    off[b] = total;
    total += recv_bytes[b];
  }
  if (n > 1) AdviseHugePages(out, total);
  if (recv_bytes[r] > 0 && out + off[r] != send) std::memmove(out + off[r], send, recv_bytes[r]);
  if (n == 1 || total == 0) return Status::OK();

  const int64_t piece = PieceBytes(total, n, 1, opt_);
  std::vector<std::vector<Piece>> pieces(n);
  for (int b = 0; b < n; ++b) SplitBySize(recv_bytes[b], 1, piece, &pieces[b]);

  Plan plan;
  plan.steps = n - 1;
  plan.tag = kAllgatherTag;
  plan.pieces = &pieces;
  plan.send_block = [&](int s) { return Mod(r - s, n); };
  plan.recv_block = [&](int s) { return Mod(r - s - 1, n); };
  plan.send_base = [&](int, int b) -> const char* { return out + off[b]; };
  plan.recv_base = [&](int, int b) -> char* { return out + off[b]; };
  TFRING_LOG(TRACE) << "ring allgather: " << total << " bytes";
  return Run(plan);
}

Status RingDataPlane::Broadcast(void* buffer, int64_t bytes, int root) {
  const int n = comm_->size(), r = comm_->rank();
  if (root < 0 || root >= n) {
    return Status::InvalidArgument("tfring: ring broadcast root " + std::to_string(root) +
                                   " is not a rank of the set (size " + std::to_string(n) + ")");
  }
  if (n == 1 || bytes <= 0) return Status::OK();
  // A pipelined chain root -> root+1 -> ... -> root-1: piece k travels down
  // the chain while piece k+1 leaves the root, so the time is that of
  // (pieces + n - 2) piece transfers rather than (n - 1) whole messages.
  char* buf = static_cast<char*>(buffer);
  const int pos = Mod(r - root, n);
  const int next = pos < n - 1 ? Mod(r + 1, n) : -1;
  const int prev = pos > 0 ? Mod(r - 1, n) : -1;
  std::vector<Piece> pieces;
  SplitBySize(bytes, 1, PieceBytes(bytes, 1, 1, opt_), &pieces);
  const int npieces = static_cast<int>(pieces.size());
  std::vector<CommRequestPtr> recvs(prev >= 0 ? npieces : 0);
  std::vector<CommRequestPtr> sends;
  sends.reserve(next >= 0 ? npieces : 0);
  auto send = [&](int k) -> Status {
    CommRequestPtr req;
    TFRING_RETURN_IF_ERROR(
        comm_->Isend(buf + pieces[k].off, pieces[k].len, next, Tag(kBroadcastTag, k), &req));
    sends.push_back(std::move(req));
    return Status::OK();
  };
  auto body = [&]() -> Status {
    // Pieces are disjoint, so every receive can be posted at once.
    for (int k = 0; k < static_cast<int>(recvs.size()); ++k) {
      TFRING_RETURN_IF_ERROR(comm_->Irecv(buf + pieces[k].off, pieces[k].len, prev,
                                          Tag(kBroadcastTag, k), &recvs[k]));
    }
    for (int k = 0; k < npieces; ++k) {
      if (prev >= 0) {
        TFRING_RETURN_IF_ERROR(WaitFor(*comm_, &recvs[k], "ring broadcast receive"));
      }
      if (next >= 0) TFRING_RETURN_IF_ERROR(send(k));
    }
    for (CommRequestPtr& req : sends) {
      TFRING_RETURN_IF_ERROR(WaitFor(*comm_, &req, "ring broadcast send"));
    }
    return Status::OK();
  };
  Status s = body();
  if (!s.ok()) Abandon(*comm_, &recvs, &sends);
  return s;
}

Status RingDataPlane::Alltoall(const void* send, const std::vector<int64_t>& send_bytes,
                               void* recv, const std::vector<int64_t>& recv_bytes) {
  const int n = comm_->size(), r = comm_->rank();
  if (static_cast<int>(send_bytes.size()) != n || static_cast<int>(recv_bytes.size()) != n) {
    return Status::InvalidArgument("tfring: ring alltoall got " +
                                   std::to_string(send_bytes.size()) + " send and " +
                                   std::to_string(recv_bytes.size()) + " receive sizes for " +
                                   std::to_string(n) + " ranks");
  }
  if (send_bytes[r] != recv_bytes[r]) {
    return Status::InvalidArgument("tfring: ring alltoall sends " + std::to_string(send_bytes[r]) +
                                   " bytes to itself but expects " +
                                   std::to_string(recv_bytes[r]));
  }
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  std::vector<int64_t> soff(n, 0), roff(n, 0);
  for (int j = 1; j < n; ++j) {
    soff[j] = soff[j - 1] + send_bytes[j - 1];
    roff[j] = roff[j - 1] + recv_bytes[j - 1];
  }
  if (recv_bytes[r] > 0) std::memmove(out + roff[r], in + soff[r], recv_bytes[r]);
  if (n == 1) return Status::OK();
  // Every receive is posted before any send, so every message finds its
  // buffer; the sends then go out in pairwise order (step s: to r+s while
  // r-s sends here), which spreads the load instead of every rank sending to
  // rank 0 first. Empty blocks still travel as empty messages: a size that
  // differs between the two sides is then an error, not a hang.
  std::vector<CommRequestPtr> recvs(n), sends(n);
  auto body = [&]() -> Status {
    for (int s = 1; s < n; ++s) {
      const int from = Mod(r - s, n);
      TFRING_RETURN_IF_ERROR(comm_->Irecv(out + roff[from], recv_bytes[from], from,
                                          Tag(kAlltoallTag, 0), &recvs[from]));
    }
    for (int s = 1; s < n; ++s) {
      const int to = Mod(r + s, n);
      TFRING_RETURN_IF_ERROR(
          comm_->Isend(in + soff[to], send_bytes[to], to, Tag(kAlltoallTag, 0), &sends[to]));
    }
    for (int s = 1; s < n; ++s) {
      TFRING_RETURN_IF_ERROR(WaitFor(*comm_, &recvs[Mod(r - s, n)], "ring alltoall receive"));
    }
    for (CommRequestPtr& req : sends) {
      if (req) TFRING_RETURN_IF_ERROR(WaitFor(*comm_, &req, "ring alltoall send"));
    }
    return Status::OK();
  };
  Status s = body();
  if (!s.ok()) Abandon(*comm_, &recvs, &sends);
  TFRING_LOG(TRACE) << "ring alltoall: " << soff[n - 1] + send_bytes[n - 1] << " bytes out";
  return s;
}

Status RingDataPlane::Reducescatter(const void* send, void* recv,
                                    const std::vector<int64_t>& recv_counts, DataType dtype,
                                    ReduceOp op) {
  TFRING_RETURN_IF_ERROR(CheckReduceOp(op, "reducescatter"));
  const int n = comm_->size(), r = comm_->rank();
  if (static_cast<int>(recv_counts.size()) != n) {
    return Status::InvalidArgument("tfring: ring reducescatter got " +
                                   std::to_string(recv_counts.size()) + " counts for " +
                                   std::to_string(n) + " ranks");
  }
  const int64_t esize = DataTypeSize(dtype);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  std::vector<int64_t> off(n, 0);
  int64_t total = 0;
  for (int b = 0; b < n; ++b) {
    off[b] = total;
    total += recv_counts[b];
  }
  if (n == 1) {
    if (recv_counts[0] > 0 && out != in) std::memmove(out, in, recv_counts[0] * esize);
    return Status::OK();
  }
  if (total == 0) return Status::OK();

  // The scatter-reduce half of the ring, shifted by one block so that rank r
  // ends with block r: at step s it sends block r-s-1 and receives block
  // r-s-2. Each block arrives once, into its own place in `work_` (into
  // `recv` for the last, which is this rank's), and the local contribution is
  // added in place there; no slots, no copies.
  if (work_.size() < static_cast<size_t>(total * esize)) work_.resize(total * esize);
  char* work = work_.data();
  const int64_t piece = PieceBytes(total * esize, n, esize, opt_);
  std::vector<std::vector<Piece>> pieces(n);
  for (int b = 0; b < n; ++b) SplitBySize(recv_counts[b], esize, piece, &pieces[b]);

  Plan plan;
  plan.steps = n - 1;
  plan.tag = kReducescatterTag;
  plan.pieces = &pieces;
  plan.send_block = [&](int s) { return Mod(r - s - 1, n); };
  plan.recv_block = [&](int s) { return Mod(r - s - 2, n); };
  plan.send_base = [&](int s, int b) -> const char* {
    return (s == 0 ? in : work) + off[b] * esize;
  };
  plan.recv_base = [&](int, int b) -> char* { return b == r ? out : work + off[b] * esize; };
  plan.on_recv = [&](int, int b, const Piece& pc, char* data) -> Status {
    if (pc.len == 0) return Status::OK();
    return ReduceInto(data, in + off[b] * esize + pc.off, pc.len / esize, dtype, op);
  };
  TFRING_LOG(TRACE) << "ring reducescatter: " << total << " x " << DataTypeName(dtype);
  return Run(plan);
}

}  // namespace

Status CreateRingDataPlane(std::shared_ptr<Communicator> comm, bool duplicate,
                           const RingOptions& options, std::unique_ptr<DataPlane>* out) {
  if (!comm) {
    return Status::InvalidArgument("tfring: the ring data plane needs a communicator");
  }
  std::shared_ptr<Communicator> ring = comm;
  if (duplicate) TFRING_RETURN_IF_ERROR(comm->Dup(&ring));
  out->reset(new RingDataPlane(ring, options));
  TFRING_LOG(DEBUG) << "ring data plane: rank " << ring->rank() << " of " << ring->size()
                    << " over " << ring->transport()
                    << (options.segment_bytes > 0
                            ? ", pieces of " + std::to_string(options.segment_bytes) + " bytes"
                            : std::string(", pieces sized by message"));
  return Status::OK();
}

}  // namespace ring_internal

Status CreateRingDataPlane(std::shared_ptr<Communicator> comm, std::unique_ptr<DataPlane>* out,
                           AllreduceAlgorithm allreduce) {
  ring_internal::RingOptions options;
  options.allreduce = allreduce;
  return ring_internal::CreateRingDataPlane(std::move(comm), true, options, out);
}

}  // namespace tfring
