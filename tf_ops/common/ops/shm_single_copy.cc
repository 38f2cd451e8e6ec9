// The shared-memory plane's single-copy path (ShmOptions::single_copy):
// broadcast and allgather read the source rank's buffer directly.
//
// From a size on, when every rank may read the others' memory
// (process_vm_readv; probed and agreed once, at set-up), broadcast and
// allgather skip the segment: one exchange shares the source buffers'
// addresses, each rank copies what it needs straight from them into its
// output, and a second exchange keeps every source alive until all have
// read. Each byte is copied once, and the ranks do not move in lockstep
// while they copy, which on a busy host (a rank descheduled between two
// steps stalls the others) matters as much as the bytes. A rank whose read
// fails says so in the second exchange, and all ranks then run the staged
// path instead.
//
// It is opt-in (ShmOptions::single_copy, TFRING_SHM_SINGLE_COPY=1). On the
// 2-core test host under load, alone (tests/bench/shm_bench --compare) it matched
// the staged path's time with 40% less CPU on a broadcast's root, but inside
// TensorFlow's processes a 64 MB broadcast or allgather took 23-29 ms with
// it against 10-25 ms staged (interleaved launches, np=2): the staged copies
// run from cache, a cross-process read (page pinning, the source's memory
// map lock) does not.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shm_plane.h"

namespace tfring {

namespace {

// Something to read across processes at set-up, to check that it works.
const uint64_t kProbeValue = 0x7466726970726f62ULL;  // "tfriprob"

}  // namespace

bool ShmDataPlane::ReadPeer(int peer, uint64_t remote, char* local, int64_t bytes) const {
  while (bytes > 0) {
    // One call moves at most about 2 GB (MAX_RW_COUNT); a short read goes on.
    iovec l{local, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30))};
    iovec r{reinterpret_cast<void*>(remote), l.iov_len};
    const ssize_t got = process_vm_readv(pids_[peer], &l, 1, &r, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    local += got;
    remote += got;
    bytes -= got;
  }
  return true;
}

Status ShmDataPlane::SetUpSingleCopy(bool allowed, int64_t min_bytes) {
  if (size_ == 1) return Status::OK();
  // Step 1: every rank's pid and the address of its probe value.
  uint32_t t = BeginStep();
  const uint64_t mine[2] = {static_cast<uint64_t>(getpid()),
                            reinterpret_cast<uint64_t>(&kProbeValue)};
  std::memcpy(seg_->slot(rank_, t), mine, sizeof mine);
  TFRING_RETURN_IF_ERROR(Exchange(t));
  pids_.assign(size_, 0);
  std::vector<uint64_t> probes(size_);
  for (int j = 0; j < size_; ++j) {
    uint64_t theirs[2];
    std::memcpy(theirs, seg_->slot(j, t), sizeof theirs);
    pids_[j] = static_cast<pid_t>(theirs[0]);
    probes[j] = theirs[1];
  }
  // Step 2: whether this rank could read every peer's probe (EPERM under
  // ptrace restrictions such as Yama's ptrace_scope, ENOSYS or EPERM under
  // seccomp, ESRCH across PID namespaces); rank 0's threshold rides along.
  bool ok = allowed;
  for (int j = 0; j < size_ && ok; ++j) {
    uint64_t got = 0;
    ok = j == rank_ || (ReadPeer(j, probes[j], reinterpret_cast<char*>(&got), sizeof got) &&
                        got == kProbeValue);
  }
  t = BeginStep();
  seg_->set_meta(t, ok ? std::max<int64_t>(min_bytes, 0) : -1);
  TFRING_RETURN_IF_ERROR(Exchange(t));
  int64_t agreed = seg_->meta(0, t);
  for (int j = 1; j < size_; ++j) {
    if (seg_->meta(j, t) < 0) agreed = -1;
  }
  single_copy_min_bytes_ = agreed;
  return Status::OK();
}

Status ShmDataPlane::FinishSingleCopy(bool ok, bool* all_ok) {
  const uint32_t t = BeginStep();
  seg_->set_meta(t, ok ? 1 : 0);
  TFRING_RETURN_IF_ERROR(Exchange(t));
  *all_ok = true;
  for (int j = 0; j < size_; ++j) *all_ok = *all_ok && seg_->meta(j, t) == 1;
  return Status::OK();
}

// Two exchanges whatever the size, and each peer copies the root's input
// into its output once, as the root copies its own: no lockstep in between,
// which on a busy host (a rank descheduled between steps) matters as much as
// the bytes.
Status ShmDataPlane::SingleCopyBroadcast(const char* in, char* out, int64_t bytes, int root,
                                         bool* done) {
  uint32_t t = BeginStep();
  if (rank_ == root) seg_->set_meta(t, static_cast<int64_t>(reinterpret_cast<uintptr_t>(in)));
  TFRING_RETURN_IF_ERROR(Exchange(t));
  bool ok = true;
  if (rank_ != root) {
    ok = ReadPeer(root, static_cast<uint64_t>(seg_->meta(root, t)), out, bytes);
  } else if (out != in) {
    std::memmove(out, in, bytes);  // overlapping is against the contract, but stays defined
  }
  return FinishSingleCopy(ok, done);
}

Status ShmDataPlane::SingleCopyAllgather(const char* in, char* out,
                                         const std::vector<int64_t>& recv_bytes,
                                         const std::vector<int64_t>& off, bool* done) {
  uint32_t t = BeginStep();
  seg_->set_meta(t, static_cast<int64_t>(reinterpret_cast<uintptr_t>(in)));
  TFRING_RETURN_IF_ERROR(Exchange(t));
  bool ok = true;
  // Start with the next rank, so the ranks do not all read one peer at once.
  for (int i = 1; i < size_ && ok; ++i) {
    const int j = (rank_ + i) % size_;
    if (recv_bytes[j] > 0) {
      ok = ReadPeer(j, static_cast<uint64_t>(seg_->meta(j, t)), out + off[j], recv_bytes[j]);
    }
  }
  TFRING_RETURN_IF_ERROR(FinishSingleCopy(ok, done));
  // After everyone has read this rank's input, in case it overlaps the output.
  char* own = out + off[rank_];
  if (*done && recv_bytes[rank_] > 0 && own != in) std::memmove(own, in, recv_bytes[rank_]);
  return Status::OK();
}

}  // namespace tfring
