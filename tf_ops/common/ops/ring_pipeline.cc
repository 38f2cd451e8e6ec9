// The ring's pipeline (ring_pipeline.h).
//
// Every block is cut further into pieces, and the steps are pipelined piece
// by piece rather than step by step: as soon as piece k of step s has arrived
// and been reduced, piece k of step s+1 is on its way to the right neighbour,
// while pieces k+1.. of step s are still arriving. A few receives are kept
// posted ahead (`window`), so the transfer of one piece overlaps the
// reduction of the one before it.
#include "ring_pipeline.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <utility>

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

constexpr int64_t kHugePageAdviceMinBytes = 8 << 20;
constexpr uintptr_t kHugePage = 2u << 20;

}  // namespace

int64_t PieceBytes(int64_t total_bytes, int blocks, int64_t esize, int64_t segment_bytes) {
  int64_t piece = segment_bytes;
  if (piece <= 0) {
    piece = std::min(kMaxPieceBytes,
                     std::max(kMinPieceBytes, total_bytes / blocks / kPiecesPerBlock));
  }
  return std::max(esize, piece / esize * esize);
}

void SplitEven(int64_t elems, int64_t esize, int64_t nseg, std::vector<Piece>* out) {
  out->clear();
  out->reserve(nseg);
  for (int64_t k = 0; k < nseg; ++k) {
    const int64_t b = elems / nseg * k + std::min(k, elems % nseg);
    const int64_t len = elems / nseg + (k < elems % nseg ? 1 : 0);
    out->push_back({b * esize, len * esize});
  }
}

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
void AdviseHugePages(void* data, int64_t bytes) {
  if (bytes < kHugePageAdviceMinBytes) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + uintptr_t(bytes)) & ~(kHugePage - 1);
  // Advice only: memory that cannot take it (not anonymous, THP off) is
  // used as it is.
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

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

RingPipeline::RingPipeline(std::shared_ptr<Communicator> comm, int window)
    : comm_(std::move(comm)), window_(window > 0 ? window : kDefaultWindow) {}

Status RingPipeline::Run(const RingPlan& p) {
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
    slots_.Reserve(need);
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

}  // namespace ring_internal
}  // namespace tfring
