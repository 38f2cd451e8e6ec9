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
// The steps are pipelined piece by piece (ring_pipeline.h: the ring's
// transport plumbing); this file holds the collectives' schedules.
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

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "../logging.h"
#include "../mapped_buffer.h"
#include "../reduction.h"
#include "allreduce_algorithms.h"
#include "comm_point_to_point.h"
#include "ring_pipeline.h"

namespace tfring {
namespace ring_internal {
namespace {

Status CheckReduceOp(ReduceOp op, const char* what) {
  if (op == ReduceOp::SUM || op == ReduceOp::MIN || op == ReduceOp::MAX ||
      op == ReduceOp::PRODUCT) {
    return Status::OK();
  }
  return Status::InvalidArgument(std::string("tfring: the ring data plane cannot run ") + what +
                                 " with reduce op " + ReduceOpName(op));
}

class RingDataPlane : public DataPlane {
 public:
  RingDataPlane(std::shared_ptr<Communicator> comm, const RingOptions& opt)
      : comm_(std::move(comm)), adasum_p2p_(comm_, Tag(kAdasumTag, 0)),
        algorithms_(comm_, Tag(kAlgorithmsTag, 0)), pipeline_(comm_, opt.window), opt_(opt) {}

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
  Status RingAllreduce(const void* input, void* output, int64_t count, DataType dtype,
                       ReduceOp op);

  std::shared_ptr<Communicator> comm_;
  CommPointToPoint adasum_p2p_;
  AllreduceAlgorithms algorithms_;
  // AUTO's model inputs, measured at the first allreduce.
  bool costs_measured_ = false;
  LinkCosts costs_;
  MappedBuffer adasum_scratch_;
  RingPipeline pipeline_;
  RingOptions opt_;
  MappedBuffer work_;   // partial sums of the reducescatter (lives as long as the world)
};

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
  const int64_t piece = PieceBytes(count * esize, n, esize, opt_.segment_bytes);
  const int64_t nseg = std::max<int64_t>(1, CeilDiv(max_len * esize, piece));
  std::vector<std::vector<Piece>> pieces(n);
  for (int b = 0; b < n; ++b) SplitEven(len[b], esize, nseg, &pieces[b]);

  RingPlan plan;
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
  return pipeline_.Run(plan);
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

  const int64_t piece = PieceBytes(total, n, 1, opt_.segment_bytes);
  std::vector<std::vector<Piece>> pieces(n);
  for (int b = 0; b < n; ++b) SplitBySize(recv_bytes[b], 1, piece, &pieces[b]);

  RingPlan plan;
  plan.steps = n - 1;
  plan.tag = kAllgatherTag;
  plan.pieces = &pieces;
  plan.send_block = [&](int s) { return Mod(r - s, n); };
  plan.recv_block = [&](int s) { return Mod(r - s - 1, n); };
  plan.send_base = [&](int, int b) -> const char* { return out + off[b]; };
  plan.recv_base = [&](int, int b) -> char* { return out + off[b]; };
  TFRING_LOG(TRACE) << "ring allgather: " << total << " bytes";
  return pipeline_.Run(plan);
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
  SplitBySize(bytes, 1, PieceBytes(bytes, 1, 1, opt_.segment_bytes), &pieces);
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
  work_.Reserve(static_cast<size_t>(total * esize));
  char* work = work_.data();
  const int64_t piece = PieceBytes(total * esize, n, esize, opt_.segment_bytes);
  std::vector<std::vector<Piece>> pieces(n);
  for (int b = 0; b < n; ++b) SplitBySize(recv_counts[b], esize, piece, &pieces[b]);

  RingPlan plan;
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
  return pipeline_.Run(plan);
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
