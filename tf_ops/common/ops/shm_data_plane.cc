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
//     reduces all inputs.
//   Reducescatter: like the first half of the large allreduce, one step per
//     chunk of the largest share.
//   Allgather: each step carries one slot (size x chunk bytes) of each
//     rank's data; a rank copies its own part to its output from its slot,
//     still in cache, rather than in another pass over its input.
//   Broadcast: the root, the only writer, fills every rank's slot of the
//     step (size x size x chunk bytes); everyone, the root too when out of
//     place, copies them to the output after the exchange. So the root's
//     input is read once, and its output is written while the peers copy.
//   Alltoall: each step carries a chunk for every pair; the first step also
//     agrees how many steps the largest pair needs.
//
// Rank order. Every element is reduced as op(...op(x0, x1)..., x_{size-1}),
// whichever rank reduces it and whatever the size, so every rank's result is
// the serial reduction in rank order bit for bit (floating-point sums depend
// on the order). The owner of a slice reads its own part from its input, in
// its place in that order, rather than starting from it: that costs nothing
// out of place; in place, a rank r >= 2 combines ranks 0..r-1 a few KiB at a
// time in a local buffer first (ReduceInOrder), so no copy is staged either.
//
// Single copy (opt-in): broadcasts and allgathers from a size on read the
// source rank's memory directly; see shm_single_copy.cc.
//
#include "shm_data_plane.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "../logging.h"
#include "../reduction.h"
#include "shm_plane.h"
#include "shm_segment.h"

namespace tfring {

namespace {

constexpr int64_t kPage = 4096;
// A rank's work per step stays in its L2 cache at this size (see
// benchmarks/shm_vs_mpi.py and tests/bench/shm_bench for the tuning).
constexpr int64_t kDefaultSlotBytes = 512 * 1024;
// The segment stays well under Docker's default 64 MiB /dev/shm.
constexpr int64_t kMaxSegmentBytes = 32 * 1024 * 1024;
// Up to here one step (everyone reduces everything) beats two pipelined ones.
constexpr int64_t kDefaultSmallAllreduceBytes = 64 * 1024;
// From here broadcasts and allgathers read the source rank's memory directly
// when single copy is on: below it, the staged path's few steps from cache
// beat a system call and two exchanges (tests/bench/shm_bench --compare: 1 MB
// took 85 us staged, 114 us single copy).
constexpr int64_t kDefaultSingleCopyMinBytes = 2 * 1024 * 1024;

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

// Whether [a, a + n) and [b, b + n) share a byte.
bool Overlap(const void* a, const void* b, int64_t n) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return n > 0 && x < y + n && y < x + n;
}

// Whether [a, a + na) and [b, b + nb) share a byte.
bool OverlapRanges(const void* a, int64_t na, const void* b, int64_t nb) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return na > 0 && nb > 0 && x < y + nb && y < x + na;
}

// The part of [lo, lo + limit) that lies inside [0, total).
int64_t PartLength(int64_t total, int64_t lo, int64_t limit) {
  return Clamp(total - lo, 0, limit);
}


}  // namespace

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
  // The first reduction writes the output, so nothing is copied to it.
  for (int j = 0; j < size_; ++j) sources_[j] = seg_->slot(j, t);
  Status s = ReduceInOrder(out, sources_.data(), size_, count, dtype, op);
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
      for (int j = 0; j < size_; ++j) {
        sources_[j] = j == rank_ ? in + off * esize : seg_->slot(j, t) + rank_ * chunk_;
      }
      Status s = ReduceInOrder(buf + off * esize, sources_.data(), size_, len, dtype, op);
      if (!s.ok()) return Fail(s);
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
    // An output that overlaps this rank's share elsewhere than exactly on
    // it takes the share first (ReduceInOrder needs dst == a source or disjoint).
    if (dst != own && Overlap(dst, own, n * esize)) {
      std::memmove(dst, own, n * esize);
      own = dst;
    }
    for (int j = 0; j < size_; ++j) sources_[j] = j == rank_ ? own : seg_->slot(j, t) + rank_ * chunk_;
    Status s = ReduceInOrder(dst, sources_.data(), size_, n, dtype, op);
    if (!s.ok()) return Fail(s);
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
  const int64_t total = off[size_];
  char* own = out + off[rank_];
  if (size_ > 1 && single_copy() && total >= single_copy_min_bytes_ && total > 0) {
    // A rank whose input overlaps its output elsewhere than at its own place
    // still joins the exchanges, but reads nothing and says so: everyone
    // then takes the staged path below.
    const bool fits = own == in || !OverlapRanges(in, recv_bytes[rank_], out, total);
    bool done = false;
    if (fits) {
      TFRING_RETURN_IF_ERROR(SingleCopyAllgather(in, out, recv_bytes, off, &done));
    } else {
      const uint32_t t = BeginStep();
      seg_->set_meta(t, 0);  // no address: a peer's read fails at once
      TFRING_RETURN_IF_ERROR(Exchange(t));
      TFRING_RETURN_IF_ERROR(FinishSingleCopy(false, &done));
    }
    if (done) return Status::OK();
  }
  const int64_t steps =
      size_ == 1 ? 0 : CeilDiv(*std::max_element(recv_bytes.begin(), recv_bytes.end()), slot);
  const int64_t own_bytes = recv_bytes[rank_];
  // This rank's own part is copied from its slot, still in cache, as each
  // step passes, rather than from its input in a second pass over memory;
  // unless the input already sits there (in place) or overlaps it otherwise.
  const bool own_in_steps = !Overlap(own, in, own_bytes);
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t lo = k * slot;
    const uint32_t t = BeginStep();
    const int64_t mine = PartLength(own_bytes, lo, slot);
    if (mine > 0) std::memcpy(seg_->slot(rank_, t), in + lo, mine);
    TFRING_RETURN_IF_ERROR(Exchange(t));
    for (int j = 0; j < size_; ++j) {
      const int64_t n = PartLength(recv_bytes[j], lo, slot);
      if (j != rank_ && n > 0) std::memcpy(out + off[j] + lo, seg_->slot(j, t), n);
    }
    if (own_in_steps && mine > 0) std::memcpy(own + lo, seg_->slot(rank_, t), mine);
  }
  // Last, so an input that overlaps the output is read before it is written.
  if (own_bytes > 0 && own != in && (steps == 0 || !own_in_steps)) {
    std::memmove(own, in, own_bytes);
  }
  return Status::OK();
}

Status ShmDataPlane::BroadcastOutOfPlace(const void* input, void* output, int64_t bytes,
                                         int root) {
  TFRING_RETURN_IF_ERROR(Usable());
  if (root < 0 || root >= size_) {
    return Status::InvalidArgument("tfring: broadcast root " + std::to_string(root) +
                                   " is not a rank of this set of " + std::to_string(size_));
  }
  if (bytes < 0) return Status::InvalidArgument("tfring: negative broadcast size");
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  if (size_ == 1) {
    if (out != in && bytes > 0) std::memcpy(out, in, bytes);
    return Status::OK();
  }
  // The choice depends only on what every rank shares (the size), never on
  // a rank's own buffers, so all ranks take the same path.
  if (single_copy() && bytes >= single_copy_min_bytes_ && bytes > 0) {
    bool done = false;
    TFRING_RETURN_IF_ERROR(SingleCopyBroadcast(in, out, bytes, root, &done));
    if (done) return Status::OK();
  }
  // Only the root writes, so in a broadcast step it may fill every rank's
  // slot of the step's parity (see shm_segment.h): steps carry size x slot bytes.
  const int64_t step_bytes = size_ * seg_->slot_bytes();
  const int64_t steps = CeilDiv(bytes, step_bytes);
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t lo = k * step_bytes;
    const int64_t n = PartLength(bytes, lo, step_bytes);
    const uint32_t t = BeginStep();
    if (rank_ == root) CopyToSlots(t, in + lo, n);
    TFRING_RETURN_IF_ERROR(Exchange(t));
    // The root's own copy comes from the slots it has just filled (still in
    // its cache) rather than from its input in memory, and after the
    // exchange, so the peers copy out at the same time.
    if (rank_ != root || out != in) CopyFromSlots(t, out + lo, n);
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
  segment->set_job_rank(options.job_rank);
  TFRING_LOG(DEBUG) << "shared-memory data plane: " << size << " ranks on " << segment->cpus()
                    << " CPUs, chunk " << segment->chunk_bytes()
                    << " bytes, one-step allreduce up to "
                    << segment->layout().small_allreduce_bytes << " bytes, spin "
                    << segment->spin_ns() / 1000 << " us";
  std::unique_ptr<ShmDataPlane> plane(new ShmDataPlane(std::move(segment)));
  TFRING_RETURN_IF_ERROR(plane->SetUpSingleCopy(
      options.single_copy, options.single_copy_min_bytes >= 0 ? options.single_copy_min_bytes
                                                              : kDefaultSingleCopyMinBytes));
  if (size > 1) {
    if (plane->single_copy()) {
      TFRING_LOG(DEBUG) << "shared-memory data plane: broadcasts and allgathers from "
                        << plane->single_copy_min_bytes()
                        << " bytes read the source rank's memory directly";
    } else {
      TFRING_LOG(DEBUG) << "shared-memory data plane: a rank may not read another's memory "
                           "(process_vm_readv), so broadcasts and allgathers go through the segment";
    }
  }
  *out = std::move(plane);
  return Status::OK();
}

bool ShmSingleCopy(const DataPlane& plane) {
  const auto* shm = dynamic_cast<const ShmDataPlane*>(&plane);
  return shm != nullptr && shm->single_copy();
}

Status CreateShmDataPlane(int rank, int size, DataPlane* bootstrap,
                          std::shared_ptr<PeerMonitor> monitor, std::unique_ptr<DataPlane>* out) {
  return CreateShmDataPlane(rank, size, bootstrap, std::move(monitor), ShmOptions(), out);
}

}  // namespace tfring
