#include "allreduce_algorithms.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "../logging.h"
#include "../mapped_buffer.h"
#include "../reduction.h"

namespace tfring {
namespace {

// Tags within the algorithms' range (tag_base + 0..1023).
constexpr int kFoldInStep = 0;
constexpr int kDoublingStep = 1;     // + step, at most 31 steps
constexpr int kHalvingStep = 32;     // + step
constexpr int kGatherStep = 64;      // + step
constexpr int kFoldOutStep = 100;
constexpr int kMeasureStep = 200;    // + 0 small, + 1 large

// The measurement's messages. alpha: a small token passed once round the
// ring, rank to rank, timed by rank 0 and divided by the hops: each hop
// waits for the one before it, as the steps of every algorithm here do. (A
// hop timed on each rank while all ranks send at once measured the ranks'
// phase instead: a rank whose message from the left had already arrived
// timed only its own send, one that arrived early timed its wait, and alpha
// varied 3-10x between launches on the same shaped links, so the choice at
// 4-64 KB changed from launch to launch.) The first rounds are not timed:
// the measurement is the set's first traffic, and they line the ranks up.
// The median round, not the least: a collective's steps pay the typical hop
// (with a wake-up from poll() when ranks outnumber cores).
// beta: a large message, every rank sending right at once as the ring does:
// 1 MiB takes 8 ms on a 1 Gbit/s link and still 200 us through loopback,
// far above alpha. Three back to back: a link that lets a burst through at
// a higher rate (a token bucket) passes the first at that rate and the
// others at the link's.
constexpr int64_t kSmallProbeBytes = 8;
constexpr int64_t kLargeProbeBytes = 1 << 20;
// short_beta's token: between the two, in the range (4-64 KB) where the
// algorithms' order changes; it becomes LinkCosts::short_bytes.
constexpr int64_t kShortProbeBytes = 16 << 10;
constexpr int kTokenWarmups = 3;
constexpr int kTokenRounds = 9;
constexpr int kLargeProbes = 3;

int LargestPowerOfTwoAtMost(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int Log2(int pow2) {
  int l = 0;
  while ((1 << l) < pow2) ++l;
  return l;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// The median seconds of `times` runs of `step` after `warmups` untimed ones.
template <typename Step>
Status MedianSeconds(int warmups, int times, Step step, double* median) {
  std::vector<double> took;
  for (int i = 0; i < warmups + times; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    TFRING_RETURN_IF_ERROR(step());
    if (i >= warmups) took.push_back(Seconds(t0));
  }
  std::sort(took.begin(), took.end());
  *median = took[took.size() / 2];
  return Status::OK();
}

}  // namespace

double PredictAllreduceSeconds(AllreduceAlgorithm algorithm, int ranks, int64_t bytes,
                               const LinkCosts& c) {
  if (ranks <= 1) return 0;
  const double n = static_cast<double>(bytes), p = ranks;
  const int pow2 = LargestPowerOfTwoAtMost(ranks);
  const int l = Log2(pow2);
  const double q = pow2;
  // The fold's two extra hops of the whole buffer and one reduction of it.
  const double fold = ranks == pow2 ? 0 : 2 * c.Hop(n) + n * c.gamma;
  switch (algorithm) {
    case AllreduceAlgorithm::RECURSIVE_DOUBLING:
      return l * (c.Hop(n) + n * c.gamma) + fold;
    case AllreduceAlgorithm::RABENSEIFNER: {
      // Step k of the halving, and of the doubling, moves n / 2^k.
      double hops = 0;
      for (int k = 1; k <= l; ++k) hops += 2 * c.Hop(n / (1 << k));
      return hops + (q - 1) / q * n * c.gamma + fold;
    }
    case AllreduceAlgorithm::AUTO:
    case AllreduceAlgorithm::RING:
      break;
  }
  // Scatter-reduce: each piece's reduction overlaps the next piece's
  // transfer, so the slower of the two counts; allgather: transfer only.
  const double piece = n / p;
  return (p - 1) * (std::max(c.Hop(piece), c.alpha + piece * c.gamma) + c.Hop(piece));
}

AllreduceAlgorithm ChooseAllreduceAlgorithm(int ranks, int64_t bytes, const LinkCosts& costs) {
  AllreduceAlgorithm best = AllreduceAlgorithm::RING;
  double best_s = PredictAllreduceSeconds(best, ranks, bytes, costs);
  for (AllreduceAlgorithm a :
       {AllreduceAlgorithm::RECURSIVE_DOUBLING, AllreduceAlgorithm::RABENSEIFNER}) {
    const double s = PredictAllreduceSeconds(a, ranks, bytes, costs);
    if (s < best_s) {
      best = a;
      best_s = s;
    }
  }
  return best;
}

Status AllreduceAlgorithms::SendRecv(const void* send, int64_t send_bytes, int to, void* recv,
                                     int64_t recv_bytes, int from, int tag, const char* what) {
  // The receive goes first so that the peer's message finds it posted.
  CommRequestPtr rq, sq;
  if (recv) TFRING_RETURN_IF_ERROR(comm_->Irecv(recv, recv_bytes, from, tag, &rq));
  Status s = send ? comm_->Isend(send, send_bytes, to, tag, &sq) : Status::OK();
  // Data movement: keep polling (a transport may progress only inside Test).
  if (s.ok() && rq) s = comm_->Wait(rq.get(), what, true);
  if (s.ok() && sq) s = comm_->Wait(sq.get(), what, true);
  if (!s.ok()) {
    if (rq) comm_->Cancel(&rq);
    if (sq) comm_->Cancel(&sq);
  }
  return s;
}

Status AllreduceAlgorithms::Exchange(const void* send, int64_t send_bytes, void* recv,
                                     int64_t recv_bytes, int peer, int tag) {
  return SendRecv(send, send_bytes, peer, recv, recv_bytes, peer, tag, "allreduce exchange");
}

Status AllreduceAlgorithms::Combine(char* dst, const char* mine, const char* theirs,
                                    bool mine_lower, int64_t count, DataType dtype, ReduceOp op) {
  // ReduceTo is element-wise, so dst may be either operand.
  return mine_lower ? ReduceTo(dst, mine, theirs, count, dtype, op)
                    : ReduceTo(dst, theirs, mine, count, dtype, op);
}

bool AllreduceAlgorithms::Alone(const char* in, char* out, int64_t bytes) {
  if (comm_->size() > 1 && bytes > 0) return false;
  if (out != in && bytes > 0) std::memcpy(out, in, bytes);
  return true;
}

Status AllreduceAlgorithms::FoldIn(const char* in, char* out, int64_t count, DataType dtype,
                                   ReduceOp op, Fold* f, const char** cur) {
  const int n = comm_->size(), r = comm_->rank();
  const int64_t bytes = count * DataTypeSize(dtype);
  // Both algorithms receive at most a whole input at a time.
  scratch_.Reserve(static_cast<size_t>(bytes));
  f->pow2 = LargestPowerOfTwoAtMost(n);
  f->extra = n - f->pow2;
  *cur = in;
  if (r >= 2 * f->extra) {
    f->vrank = r - f->extra;
    return Status::OK();
  }
  if (r % 2 == 0) {
    f->vrank = -1;
    CommRequestPtr sq;
    TFRING_RETURN_IF_ERROR(comm_->Isend(in, bytes, r + 1, Tag(kFoldInStep), &sq));
    return comm_->Wait(sq.get(), "allreduce fold", true);
  }
  f->vrank = r / 2;
  CommRequestPtr rq;
  TFRING_RETURN_IF_ERROR(comm_->Irecv(scratch_.data(), bytes, r - 1, Tag(kFoldInStep), &rq));
  TFRING_RETURN_IF_ERROR(comm_->Wait(rq.get(), "allreduce fold", true));
  TFRING_RETURN_IF_ERROR(Combine(out, in, scratch_.data(), false, count, dtype, op));
  *cur = out;
  return Status::OK();
}

Status AllreduceAlgorithms::FoldOut(const Fold& f, char* out, int64_t bytes) {
  const int r = comm_->rank();
  if (r >= 2 * f.extra) return Status::OK();
  CommRequestPtr req;
  if (f.vrank < 0) {
    TFRING_RETURN_IF_ERROR(comm_->Irecv(out, bytes, r + 1, Tag(kFoldOutStep), &req));
  } else {
    TFRING_RETURN_IF_ERROR(comm_->Isend(out, bytes, r - 1, Tag(kFoldOutStep), &req));
  }
  return comm_->Wait(req.get(), "allreduce fold", true);
}

Status AllreduceAlgorithms::RecursiveDoubling(const void* input, void* output, int64_t count,
                                              DataType dtype, ReduceOp op) {
  const int64_t bytes = count * DataTypeSize(dtype);
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  if (Alone(in, out, bytes)) return Status::OK();
  Fold f;
  const char* cur = in;  // this rank's partial result: the input until reduced into out
  TFRING_RETURN_IF_ERROR(FoldIn(in, out, count, dtype, op, &f, &cur));
  if (f.vrank >= 0) {
    for (int mask = 1, step = 0; mask < f.pow2; mask <<= 1, ++step) {
      const int vpeer = f.vrank ^ mask;
      TFRING_RETURN_IF_ERROR(
          Exchange(cur, bytes, scratch_.data(), bytes, RealRank(f, vpeer), Tag(kDoublingStep + step)));
      TFRING_RETURN_IF_ERROR(
          Combine(out, cur, scratch_.data(), f.vrank < vpeer, count, dtype, op));
      cur = out;
    }
  }
  return FoldOut(f, out, bytes);
}

Status AllreduceAlgorithms::Rabenseifner(const void* input, void* output, int64_t count,
                                         DataType dtype, ReduceOp op) {
  const int64_t esize = DataTypeSize(dtype);
  const int64_t bytes = count * esize;
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  if (Alone(in, out, bytes)) return Status::OK();
  Fold f;
  const char* cur = in;
  TFRING_RETURN_IF_ERROR(FoldIn(in, out, count, dtype, op, &f, &cur));
  if (f.vrank >= 0) {
    // p' blocks, the first count % p' one element longer; some are empty
    // (and travel as empty messages) when count < p'.
    const int q = f.pow2;
    off_.resize(q + 1);
    len_.resize(q);
    off_[0] = 0;
    for (int b = 0; b < q; ++b) {
      len_[b] = count / q + (b < count % q ? 1 : 0);
      off_[b + 1] = off_[b] + len_[b];
    }
    auto span = [&](int lo, int hi) { return (off_[hi] - off_[lo]) * esize; };
    // Reduce-scatter by recursive halving: at each step this rank keeps the
    // half of its blocks on its side of the partner, sends the other half,
    // and reduces what arrives into what it keeps. It ends owning block
    // vrank, reduced over all ranks (and only there).
    int lo = 0, hi = q, step = 0;
    for (int mask = q / 2; mask >= 1; mask >>= 1, ++step) {
      const int vpeer = f.vrank ^ mask;
      const int mid = (lo + hi) / 2;
      const bool lower = (f.vrank & mask) == 0;
      const int keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
      const int send_lo = lower ? mid : lo, send_hi = lower ? hi : mid;
      const int64_t keep_at = off_[keep_lo] * esize;
      TFRING_RETURN_IF_ERROR(Exchange(cur + off_[send_lo] * esize, span(send_lo, send_hi),
                                      scratch_.data(), span(keep_lo, keep_hi),
                                      RealRank(f, vpeer), Tag(kHalvingStep + step)));
      TFRING_RETURN_IF_ERROR(Combine(out + keep_at, cur + keep_at, scratch_.data(), lower,
                                     off_[keep_hi] - off_[keep_lo], dtype, op));
      // Every later send is within what this rank keeps, now in out.
      cur = out;
      lo = keep_lo;
      hi = keep_hi;
    }
    // Allgather by recursive doubling, the halving in reverse: the partner
    // owns the sibling range of this rank's, and both end with the union.
    step = 0;
    for (int mask = 1; mask < q; mask <<= 1, ++step) {
      const int vpeer = f.vrank ^ mask;
      const int width = hi - lo;
      const int peer_lo = (f.vrank & mask) == 0 ? hi : lo - width;
      TFRING_RETURN_IF_ERROR(Exchange(out + off_[lo] * esize, span(lo, hi),
                                      out + off_[peer_lo] * esize, span(peer_lo, peer_lo + width),
                                      RealRank(f, vpeer), Tag(kGatherStep + step)));
      lo = std::min(lo, peer_lo);
      hi = lo + 2 * width;
    }
  }
  return FoldOut(f, out, bytes);
}

Status AllreduceAlgorithms::PassToken(char* send, char* recv, int64_t bytes, int left,
                                      int right, int tag) {
  if (comm_->rank() == 0) {
    return SendRecv(send, bytes, right, recv, bytes, left, tag, "link measurement");
  }
  // Received, then passed on: the next rank cannot start before this one.
  TFRING_RETURN_IF_ERROR(SendRecv(nullptr, 0, right, recv, bytes, left, tag, "link measurement"));
  return SendRecv(send, bytes, right, nullptr, 0, left, tag, "link measurement");
}

Status AllreduceAlgorithms::MeasureLinkCosts(LinkCosts* out) {
  const int n = comm_->size(), r = comm_->rank();
  *out = LinkCosts();
  if (n == 1) return Status::OK();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  // Mapped, not malloc'ed: once glibc's mmap threshold has risen (any freed
  // block over 1 MiB does that), two 1 MiB vectors come from this thread's
  // arena, which keeps them resident after the world ends, and a reset that
  // found that arena fragmented grew a worker by 1 MiB more (issue 40).
  MappedBuffer send(kLargeProbeBytes), recv(kLargeProbeBytes);
  std::memset(send.data(), 1, kLargeProbeBytes);
  // Rank 0's median round of a token of `bytes`, per hop; 0 elsewhere.
  auto token = [&](int64_t bytes, double* per_hop) -> Status {
    double round_s = 0;
    TFRING_RETURN_IF_ERROR(MedianSeconds(
        kTokenWarmups, kTokenRounds,
        [&] { return PassToken(send.data(), recv.data(), bytes, left, right, Tag(kMeasureStep)); },
        &round_s));
    *per_hop = r == 0 ? round_s / n : 0.0;
    return Status::OK();
  };
  double tiny_s = 0, short_s = 0, large_s = 0;
  TFRING_RETURN_IF_ERROR(token(kSmallProbeBytes, &tiny_s));
  TFRING_RETURN_IF_ERROR(token(kShortProbeBytes, &short_s));
  // A large hop, every rank sending right at once.
  TFRING_RETURN_IF_ERROR(MedianSeconds(
      0, kLargeProbes,
      [&] {
        return SendRecv(send.data(), kLargeProbeBytes, right, recv.data(), kLargeProbeBytes, left,
                        Tag(kMeasureStep + 1), "link measurement");
      },
      &large_s));
  double reduce_s = 1e30;
  for (int i = 0; i < kLargeProbes; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    TFRING_RETURN_IF_ERROR(ReduceInto(recv.data(), send.data(),
                                      kLargeProbeBytes / static_cast<int64_t>(sizeof(float)),
                                      DataType::FLOAT32, ReduceOp::SUM));
    reduce_s = std::min(reduce_s, Seconds(t0));
  }
  // The slowest rank's times bound a collective (only rank 0 timed the
  // tokens; the others add 0), and every rank derives the costs from the
  // same times, so all choose the same algorithm for the same message.
  double took[4] = {tiny_s, short_s, large_s, reduce_s};
  TFRING_RETURN_IF_ERROR(RecursiveDoubling(took, took, 4, DataType::FLOAT64, ReduceOp::MAX));
  out->alpha = took[0];
  out->short_bytes = kShortProbeBytes;
  out->short_beta = std::max(0.0, took[1] - took[0]) / kShortProbeBytes;
  // Hop(large) = Hop(short) + the rest at beta.
  out->beta = std::max(0.0, took[2] - std::max(took[0], took[1])) /
              (kLargeProbeBytes - kShortProbeBytes);
  out->gamma = took[3] / kLargeProbeBytes;
  TFRING_LOG(DEBUG) << "allreduce link costs over " << n << " ranks (" << comm_->transport()
                    << "): alpha " << out->alpha * 1e6 << " us, beta " << out->short_beta * 1e9
                    << " ns/byte for a message's first " << kShortProbeBytes << " bytes, "
                    << out->beta * 1e9 << " after, gamma " << out->gamma * 1e9 << " ns/byte";
  return Status::OK();
}

}  // namespace tfring
