// The shared-memory plane's class, private to its two files:
// shm_data_plane.cc (set-up and the collectives through the segment) and
// shm_single_copy.cc (broadcast and allgather straight from the source
// rank's memory). Everyone else goes through shm_data_plane.h.
#ifndef TFRING_COMMON_OPS_SHM_PLANE_H
#define TFRING_COMMON_OPS_SHM_PLANE_H

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "data_plane.h"
#include "shm_segment.h"

namespace tfring {

class ShmDataPlane : public DataPlane {
 public:
  explicit ShmDataPlane(std::unique_ptr<ShmSegment> segment)
      : seg_(std::move(segment)), rank_(seg_->rank()), size_(seg_->size()),
        chunk_(seg_->chunk_bytes()), sources_(size_) {}

  const char* name() const override { return "SHM"; }

  // Collective: finds out whether every rank may read every other rank's
  // memory (process_vm_readv: same user, ptrace permission, one PID
  // namespace), and agrees on it. `allowed` false makes this rank refuse.
  // From then on broadcasts and allgathers of at least rank 0's
  // `min_bytes` copy each byte once, straight from the source rank's
  // buffer, instead of through the segment.
  Status SetUpSingleCopy(bool allowed, int64_t min_bytes);
  bool single_copy() const { return single_copy_min_bytes_ >= 0; }
  int64_t single_copy_min_bytes() const { return single_copy_min_bytes_; }

  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgather(const void* send, void* recv, const std::vector<int64_t>& recv_bytes) override;
  Status Broadcast(void* buffer, int64_t bytes, int root) override {
    return BroadcastOutOfPlace(buffer, buffer, bytes, root);
  }
  bool broadcasts_out_of_place() const override { return true; }
  Status BroadcastOutOfPlace(const void* input, void* output, int64_t bytes, int root) override;
  Status Alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes) override;
  Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  Status Barrier() override;

 private:
  Status SmallAllreduce(const char* in, char* out, int64_t count, DataType dtype, ReduceOp op);
  Status PipelinedAllreduce(const char* in, char* out, int64_t count, DataType dtype, ReduceOp op);

  // Copies n <= size x slot_bytes bytes into (out of) the slots of step t of
  // every rank in rank order: only for collectives where one rank writes.
  void CopyToSlots(uint32_t t, const char* src, int64_t n) {
    const int64_t slot = seg_->slot_bytes();
    for (int j = 0; j < size_ && n > 0; ++j, src += slot, n -= slot) {
      std::memcpy(seg_->slot(j, t), src, std::min(n, slot));
    }
  }
  void CopyFromSlots(uint32_t t, char* dst, int64_t n) const {
    const int64_t slot = seg_->slot_bytes();
    for (int j = 0; j < size_ && n > 0; ++j, dst += slot, n -= slot) {
      std::memcpy(dst, seg_->slot(j, t), std::min(n, slot));
    }
  }

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
    seg_->Abandon("rank " + std::to_string(rank_) + " failed: " + s.message(), s.cause(), s.rank());
    return s;
  }
  Status Usable() const {
    if (broken_.ok()) return broken_;
    return Status::Make(StatusCode::ABORTED, broken_.cause(),
                        "tfring: the shared-memory data plane is unusable after an earlier "
                        "failure: " + broken_.message(),
                        broken_.rank());
  }

  std::unique_ptr<ShmSegment> seg_;
  const int rank_, size_;
  const int64_t chunk_;
  // One reduction's sources in rank order (reused, so a collective allocates nothing).
  std::vector<const void*> sources_;
  uint32_t step_ = 1;  // the segment's counters start at 0 = "nothing published"
  Status broken_;
  // Set up by SetUpSingleCopy(): each rank's process id, and the smallest
  // message that takes the single-copy path (-1: never).
  std::vector<pid_t> pids_;
  int64_t single_copy_min_bytes_ = -1;

  // Reads `bytes` at `remote` in rank `peer`'s memory into `local`.
  bool ReadPeer(int peer, uint64_t remote, char* local, int64_t bytes) const;
  // The single-copy broadcast and allgather: Ok(true) when done, Ok(false)
  // when some rank could not read a peer's memory (every rank then returns
  // false, and the caller runs the staged path), or the error that broke
  // the plane.
  Status SingleCopyBroadcast(const char* in, char* out, int64_t bytes, int root, bool* done);
  Status SingleCopyAllgather(const char* in, char* out, const std::vector<int64_t>& recv_bytes,
                             const std::vector<int64_t>& off, bool* done);
  // Ends a single-copy collective: publishes whether this rank's reads all
  // succeeded and waits for everyone, so no rank returns (and frees or
  // changes its buffer) while a peer still reads it. *all_ok: every rank's did.
  Status FinishSingleCopy(bool ok, bool* all_ok);
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_SHM_PLANE_H
