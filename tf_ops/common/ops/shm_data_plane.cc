// Collectives over a ShmSegment (see shm_segment.h for the step protocol).
//
// Every collective is a sequence of steps; in each, a rank fills its own slot
// (one chunk-sized place per rank), publishes, waits for the others, and
// reads from theirs. Data is read from and written to the caller's buffers
// directly: a rank never stages its own share, and results land in the
// output (which may be the input) with no copy of the input made first.
//
//   Allreduce (large): the message is cut into blocks of size x chunk; within
//     a block, rank j owns slice j. In step k a rank copies the slices it does
//     not own of block k into its slot (place j for owner j) and its reduced
//     slice of block k-1 (place rank); after the exchange it copies the
//     reduced slices of block k-1 out of the owners' slots, and reduces its
//     own slice of block k from its input plus the peers' copies into the output.
//     So one exchange per block, each rank reduces 1/size of the message, and
//     each byte is copied once into and once out of shared memory.
//   Allreduce (small): one step; every rank copies its whole input in and
//     reduces all inputs in rank order (identical results everywhere).
//   Reducescatter: like the first half of the large allreduce, one step per
//     chunk of the largest share.
//   Allgather, Broadcast: each step carries one slot (size x chunk bytes) of
//     each rank's (the root's) data.
//   Alltoall: each step carries a chunk for every pair; the first step also
//     agrees how many steps the largest pair needs.
#include "shm_data_plane.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "../logging.h"
#include "../reduction.h"
#include "shm_segment.h"

namespace tfring {

namespace {

constexpr int64_t kPage = 4096;
// A rank's work per step stays in its L2 cache at this size (see
// benchmarks/shm_vs_mpi.py and the shm_test bench mode for the tuning).
constexpr int64_t kDefaultSlotBytes = 512 * 1024;
// The segment stays well under Docker's default 64 MiB /dev/shm.
constexpr int64_t kMaxSegmentBytes = 32 * 1024 * 1024;
// Up to here one step (everyone reduces everything) beats two pipelined ones.
constexpr int64_t kDefaultSmallAllreduceBytes = 64 * 1024;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t v, int64_t to) { return CeilDiv(v, to) * to; }
int64_t Clamp(int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(v, hi)); }

Status CheckReduceOp(ReduceOp op) {
  if (op == ReduceOp::SUM || op == ReduceOp::MIN || op == ReduceOp::MAX ||
      op == ReduceOp::PRODUCT) {
    return Status::OK();
  }
  return Status::InvalidArgument(std::string("tfring: the shared-memory data plane cannot apply ") +
                                 ReduceOpName(op) + " element-wise");
}

Status CheckPerRank(const std::vector<int64_t>& v, int size, const char* what) {
  if (static_cast<int>(v.size()) != size) {
    return Status::InvalidArgument(std::string("tfring: ") + what + " has " +
                                   std::to_string(v.size()) + " entries for " +
                                   std::to_string(size) + " ranks");
  }
  for (int64_t x : v) {
    if (x < 0) return Status::InvalidArgument(std::string("tfring: negative size in ") + what);
  }
  return Status::OK();
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> off(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), off.begin() + 1);
  return off;
}

// The part of [lo, lo + limit) that lies inside [0, total).
int64_t PartLength(int64_t total, int64_t lo, int64_t limit) {
  return Clamp(total - lo, 0, limit);
}

class ShmDataPlane : public DataPlane {
 public:
  explicit ShmDataPlane(std::unique_ptr<ShmSegment> segment)
      : seg_(std::move(segment)), rank_(seg_->rank()), size_(seg_->size()),
        chunk_(seg_->chunk_bytes()) {}

  const char* name() const override { return "SHM"; }

  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgather(const void* send, void* recv, const std::vector<int64_t>& recv_bytes) override;
  Status Broadcast(void* buffer, int64_t bytes, int root) override;
  Status Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes) override;
  Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  Status Barrier() override;

 private:
  Status SmallAllreduce(const char* in, char* out, int64_t count, DataType dtype, ReduceOp op);
  Status PipelinedAllreduce(const char* in, char* out, int64_t count, DataType dtype, ReduceOp op);

  // Starts a step: its number (this rank's slot for it is seg_->slot(rank_, t)).
  uint32_t BeginStep() { return step_++; }
  // Publishes this rank's slot for step t and waits for everyone else's.
  Status Exchange(uint32_t t) {
    seg_->Publish(t);
    Status s = seg_->WaitAll(t);
    return s.ok() ? s : Fail(s);
  }
  // A failure in the middle of a collective leaves the ranks at different
  // steps: the plane cannot be used again, and the peers are told so rather
  // than left waiting.
  Status Fail(const Status& s) {
    broken_ = s;
    seg_->Abandon("rank " + std::to_string(rank_) + " failed: " + s.message());
    return s;
  }
  Status Usable() const {
    if (broken_.ok()) return broken_;
    return Status::Aborted("tfring: the shared-memory data plane is unusable after an earlier "
                           "failure: " + broken_.message());
  }

  std::unique_ptr<ShmSegment> seg_;
  const int rank_, size_;
  const int64_t chunk_;
  uint32_t step_ = 1;  // the segment's counters start at 0 = "nothing published"
  Status broken_;
};

Status ShmDataPlane::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                               ReduceOp op) {
  TFRING_RETURN_IF_ERROR(Usable());
  TFRING_RETURN_IF_ERROR(CheckReduceOp(op));
  if (count < 0) return Status::InvalidArgument("tfring: negative element count in allreduce");
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  // Every rank sees the same count, so all skip together.
  if (count == 0) return Status::OK();
  if (size_ == 1) {
    if (out != in) std::memcpy(out, in, count * DataTypeSize(dtype));
    return Status::OK();
  }
  if (count * DataTypeSize(dtype) <= seg_->layout().small_allreduce_bytes) {
    return SmallAllreduce(in, out, count, dtype, op);
  }
  return PipelinedAllreduce(in, out, count, dtype, op);
}

Status ShmDataPlane::SmallAllreduce(const char* in, char* out, int64_t count, DataType dtype,
                                    ReduceOp op) {
  const int64_t bytes = count * DataTypeSize(dtype);
  const uint32_t t = BeginStep();
  std::memcpy(seg_->slot(rank_, t), in, bytes);
  TFRING_RETURN_IF_ERROR(Exchange(t));
  // The same order on every rank, so floating-point results agree bit for
  // bit; the first reduction writes the output, so nothing is copied to it.
  Status s = ReduceTo(out, seg_->slot(0, t), seg_->slot(1, t), count, dtype, op);
  for (int j = 2; j < size_ && s.ok(); ++j) s = ReduceInto(out, seg_->slot(j, t), count, dtype, op);
  return s.ok() ? s : Fail(s);
}

Status ShmDataPlane::PipelinedAllreduce(const char* in, char* buf, int64_t count, DataType dtype,
                                        ReduceOp op) {
  const int64_t esize = DataTypeSize(dtype);
  const int64_t per_chunk = chunk_ / esize;  // chunk_ is a multiple of 4 KiB
  const int64_t block = per_chunk * size_;
  const int64_t blocks = CeilDiv(count, block);
  // Slices of a partial last block start on cache-line boundaries.
  const int64_t align = std::max<int64_t>(1, 64 / esize);
  // Element range [*off, *off + *len) of rank j's slice of block k.
  auto slice = [&](int64_t k, int j, int64_t* off, int64_t* len) {
    const int64_t start = k * block;
    const int64_t n = std::min(block, count - start);
    const int64_t width = n == block ? per_chunk : RoundUp(CeilDiv(n, size_), align);
    const int64_t lo = std::min(j * width, n);
    *off = start + lo;
    *len = std::min(width, n - lo);
  };
  int64_t off, len;
  for (int64_t k = 0; k <= blocks; ++k) {
    const uint32_t t = BeginStep();
    char* mine = seg_->slot(rank_, t);
    if (k > 0) {  // my reduced slice of the previous block, for everyone
      slice(k - 1, rank_, &off, &len);
      std::memcpy(mine + rank_ * chunk_, buf + off * esize, len * esize);
    }
    if (k < blocks) {  // the slices of this block that others reduce
      for (int j = 0; j < size_; ++j) {
        if (j == rank_) continue;
        slice(k, j, &off, &len);
        std::memcpy(mine + j * chunk_, in + off * esize, len * esize);
      }
    }
    TFRING_RETURN_IF_ERROR(Exchange(t));
    if (k > 0) {  // the others' reduced slices of the previous block
      for (int j = 0; j < size_; ++j) {
        if (j == rank_) continue;
        slice(k - 1, j, &off, &len);
        std::memcpy(buf + off * esize, seg_->slot(j, t) + j * chunk_, len * esize);
      }
    }
    if (k < blocks) {  // reduce my slice of this block from the input into the output
      slice(k, rank_, &off, &len);
      const char* acc = in + off * esize;  // the first reduction reads the input
      for (int j = 0; j < size_ && len > 0; ++j) {
        if (j == rank_) continue;
        char* dst = buf + off * esize;
        Status s = ReduceTo(dst, acc, seg_->slot(j, t) + rank_ * chunk_, len, dtype, op);
        if (!s.ok()) return Fail(s);
        acc = dst;
      }
    }
  }
  return Status::OK();
}

Status ShmDataPlane::Reducescatter(const void* send, void* recv,
                                   const std::vector<int64_t>& recv_counts, DataType dtype,
                                   ReduceOp op) {
  TFRING_RETURN_IF_ERROR(Usable());
  TFRING_RETURN_IF_ERROR(CheckReduceOp(op));
  TFRING_RETURN_IF_ERROR(CheckPerRank(recv_counts, size_, "reducescatter counts"));
  const int64_t esize = DataTypeSize(dtype);
  const std::vector<int64_t> off = Offsets(recv_counts);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  const int64_t per_chunk = chunk_ / esize;
  const int64_t steps =
      CeilDiv(*std::max_element(recv_counts.begin(), recv_counts.end()), per_chunk);
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t lo = k * per_chunk;
    const uint32_t t = BeginStep();
    char* mine = seg_->slot(rank_, t);
    for (int j = 0; j < size_; ++j) {
      const int64_t n = PartLength(recv_counts[j], lo, per_chunk);
      if (j != rank_ && n > 0) std::memcpy(mine + j * chunk_, in + (off[j] + lo) * esize, n * esize);
    }
    TFRING_RETURN_IF_ERROR(Exchange(t));
    const int64_t n = PartLength(recv_counts[rank_], lo, per_chunk);
    if (n == 0) continue;
    char* dst = out + lo * esize;
    const char* own = in + (off[rank_] + lo) * esize;
    if (dst != own) std::memmove(dst, own, n * esize);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      Status s = ReduceInto(dst, seg_->slot(j, t) + rank_ * chunk_, n, dtype, op);
      if (!s.ok()) return Fail(s);
    }
  }
  return Status::OK();
}

Status ShmDataPlane::Allgather(const void* send, void* recv,
                               const std::vector<int64_t>& recv_bytes) {
  TFRING_RETURN_IF_ERROR(Usable());
  TFRING_RETURN_IF_ERROR(CheckPerRank(recv_bytes, size_, "allgather sizes"));
  const std::vector<int64_t> off = Offsets(recv_bytes);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  const int64_t slot = seg_->slot_bytes();
  const int64_t steps =
      size_ == 1 ? 0 : CeilDiv(*std::max_element(recv_bytes.begin(), recv_bytes.end()), slot);
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t lo = k * slot;
    const uint32_t t = BeginStep();
    const int64_t mine = PartLength(recv_bytes[rank_], lo, slot);
    if (mine > 0) std::memcpy(seg_->slot(rank_, t), in + lo, mine);
    TFRING_RETURN_IF_ERROR(Exchange(t));
    for (int j = 0; j < size_; ++j) {
      const int64_t n = PartLength(recv_bytes[j], lo, slot);
      if (j != rank_ && n > 0) std::memcpy(out + off[j] + lo, seg_->slot(j, t), n);
    }
  }
  // Last, so an input that overlaps the output is read before it is written.
  char* own = out + off[rank_];
  if (recv_bytes[rank_] > 0 && own != in) std::memmove(own, in, recv_bytes[rank_]);
  return Status::OK();
}

Status ShmDataPlane::Broadcast(void* buffer, int64_t bytes, int root) {
  TFRING_RETURN_IF_ERROR(Usable());
  if (root < 0 || root >= size_) {
    return Status::InvalidArgument("tfring: broadcast root " + std::to_string(root) +
                                   " is not a rank of this set of " + std::to_string(size_));
  }
  if (bytes < 0) return Status::InvalidArgument("tfring: negative broadcast size");
  char* buf = static_cast<char*>(buffer);
  const int64_t slot = seg_->slot_bytes();
  const int64_t steps = size_ == 1 ? 0 : CeilDiv(bytes, slot);
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t lo = k * slot;
    const int64_t n = PartLength(bytes, lo, slot);
    const uint32_t t = BeginStep();
    if (rank_ == root) std::memcpy(seg_->slot(rank_, t), buf + lo, n);
    TFRING_RETURN_IF_ERROR(Exchange(t));
    if (rank_ != root) std::memcpy(buf + lo, seg_->slot(root, t), n);
  }
  return Status::OK();
}

Status ShmDataPlane::Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                              const std::vector<int64_t>& recv_bytes) {
  TFRING_RETURN_IF_ERROR(Usable());
  // Sizes are this rank's own view: a bad one here would leave the others
  // waiting at a step this rank never takes, so it breaks the plane for all.
  Status bad = CheckPerRank(send_bytes, size_, "alltoall send sizes");
  if (bad.ok()) bad = CheckPerRank(recv_bytes, size_, "alltoall receive sizes");
  if (bad.ok() && send_bytes[rank_] != recv_bytes[rank_]) {
    bad = Status::InvalidArgument("tfring: alltoall sends " + std::to_string(send_bytes[rank_]) +
                                  " bytes to itself but expects " +
                                  std::to_string(recv_bytes[rank_]));
  }
  if (!bad.ok()) return size_ == 1 ? bad : Fail(bad);
  const std::vector<int64_t> soff = Offsets(send_bytes), roff = Offsets(recv_bytes);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  // Only the pairs with this rank are known here; the first step shares each
  // rank's need so all take the same number of steps.
  int64_t need = 0;
  for (int j = 0; j < size_; ++j) {
    if (j != rank_) need = std::max({need, CeilDiv(send_bytes[j], chunk_), CeilDiv(recv_bytes[j], chunk_)});
  }
  int64_t steps = 1;
  for (int64_t k = 0; size_ > 1 && k < steps; ++k) {
    const int64_t lo = k * chunk_;
    const uint32_t t = BeginStep();
    char* mine = seg_->slot(rank_, t);
    for (int j = 0; j < size_; ++j) {
      const int64_t n = PartLength(send_bytes[j], lo, chunk_);
      if (j != rank_ && n > 0) std::memcpy(mine + j * chunk_, in + soff[j] + lo, n);
    }
    if (k == 0) seg_->set_meta(t, need);
    TFRING_RETURN_IF_ERROR(Exchange(t));
    if (k == 0) {
      for (int j = 0; j < size_; ++j) steps = std::max(steps, seg_->meta(j, t));
    }
    for (int j = 0; j < size_; ++j) {
      const int64_t n = PartLength(recv_bytes[j], lo, chunk_);
      if (j != rank_ && n > 0) std::memcpy(out + roff[j] + lo, seg_->slot(j, t) + rank_ * chunk_, n);
    }
  }
  if (send_bytes[rank_] > 0) std::memmove(out + roff[rank_], in + soff[rank_], send_bytes[rank_]);
  return Status::OK();
}

Status ShmDataPlane::Barrier() {
  TFRING_RETURN_IF_ERROR(Usable());
  if (size_ == 1) return Status::OK();
  return Exchange(BeginStep());
}

}  // namespace

Status CreateShmDataPlane(int rank, int size, DataPlane* bootstrap,
                          std::shared_ptr<PeerMonitor> monitor, const ShmOptions& options,
                          std::unique_ptr<DataPlane>* out) {
  if (size < 1) return Status::InvalidArgument("tfring: a shared-memory plane needs ranks");
  ShmLayout layout;
  // Fewer bytes per rank as ranks grow, so the segment (2 x size^2 x chunk)
  // stays bounded; the chunk is only a pipeline stage, not a message limit.
  int64_t chunk = options.chunk_bytes > 0 ? options.chunk_bytes : kDefaultSlotBytes / size;
  chunk = std::min<int64_t>(chunk, kMaxSegmentBytes / (int64_t{2} * size * size));
  layout.chunk_bytes = RoundUp(std::max<int64_t>(chunk, 1), kPage);
  const int64_t small =
      options.small_allreduce_bytes >= 0 ? options.small_allreduce_bytes : kDefaultSmallAllreduceBytes;
  layout.small_allreduce_bytes = std::min(small, size * layout.chunk_bytes);

  ShmWaitPolicy policy;
  policy.spin_ns = options.spin_ns;  // negative: the segment chooses
  std::unique_ptr<ShmSegment> segment;
  TFRING_RETURN_IF_ERROR(
      ShmSegment::Create(rank, size, layout, policy, bootstrap, std::move(monitor), &segment));
  TFRING_LOG(DEBUG) << "shared-memory data plane: " << size << " ranks on " << segment->cpus()
                    << " CPUs, chunk " << segment->chunk_bytes()
                    << " bytes, one-step allreduce up to "
                    << segment->layout().small_allreduce_bytes << " bytes, spin "
                    << segment->spin_ns() / 1000 << " us";
  out->reset(new ShmDataPlane(std::move(segment)));
  return Status::OK();
}

Status CreateShmDataPlane(int rank, int size, DataPlane* bootstrap,
                          std::shared_ptr<PeerMonitor> monitor, std::unique_ptr<DataPlane>* out) {
  return CreateShmDataPlane(rank, size, bootstrap, std::move(monitor), ShmOptions(), out);
}

}  // namespace tfring
