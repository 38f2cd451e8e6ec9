#include "shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <new>
#include <random>

namespace tfring {

namespace {

constexpr uint64_t kMagic = 0x676e697266746673ULL;  // "sftfring"
constexpr uint32_t kVersion = 2;
constexpr int64_t kPage = 4096;
// Long enough that the peer monitor is asked rarely, short enough that a
// rank notices a departed or dead peer promptly even if a wake-up was lost.
constexpr long kSleepSliceNs = 10 * 1000 * 1000;
constexpr size_t kReasonBytes = 512;
constexpr int kCpuMaskWords = 16;  // 1024 CPUs, like cpu_set_t
// After kFailedSpins full spins in a row that did not see the peer arrive,
// the next kShortSpinWaits waits poll for only kShortSpinNs.
constexpr int kFailedSpins = 3;
constexpr int kShortSpinWaits = 64;
constexpr int64_t kShortSpinNs = ShmWaitPolicy::kOversubscribedSpinNs;

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

std::string Errno(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Futexes on a MAP_SHARED word work across processes as long as the private
// flag is left out (the kernel then keys the wait queue by the inode page).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, long timeout_ns) {
  timespec ts{timeout_ns / 1000000000L, timeout_ns % 1000000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Step numbers wrap around; peers are never more than a few steps apart, so
// a signed difference orders them.
inline bool Reached(uint32_t published, uint32_t step) {
  return static_cast<int32_t>(published - step) >= 0;
}

std::string UniqueName() {
  static std::atomic<uint32_t> counter{0};
  std::random_device rd;
  char name[96];
  std::snprintf(name, sizeof name, "/tfring-%d-%u-%08x", static_cast<int>(getpid()),
                counter.fetch_add(1), static_cast<unsigned>(rd()));
  return name;
}

}  // namespace

// Written once by rank 0 before any other rank maps the segment, except the
// departure fields, which any rank may set once.
struct ShmHeader {
  uint64_t magic;
  uint32_t version;
  int32_t size;
  int64_t chunk_bytes;
  int64_t small_allreduce_bytes;
  int64_t slot_bytes;
  int64_t data_offset;
  int64_t total_bytes;
  // The first rank to give up claims `claimed`, writes its reason, then sets
  // `gone` to 1 + its rank: a waiter that sees `gone` can read the reason.
  alignas(128) std::atomic<uint32_t> claimed;
  std::atomic<uint32_t> gone;
  // The failure that made it give up (a FailureCause, and the rank it names).
  int32_t cause;
  int32_t failed_rank;
  char reason[kReasonBytes];
};

// One per rank. The counter sits alone on its line (with the sleeper count,
// which its owner reads right after writing the counter); the metadata,
// written once per step, sits on another.
struct alignas(128) ShmRankControl {
  std::atomic<uint32_t> seq;       // last step published; also the futex word
  std::atomic<uint32_t> sleepers;  // peers asleep in FUTEX_WAIT on `seq`
  alignas(128) int64_t meta[2];    // by slot parity
  // The CPUs this rank may run on (sched_getaffinity), written once at set-up.
  alignas(128) uint64_t cpus[kCpuMaskWords];
};

static_assert(sizeof(ShmRankControl) == 384, "one rank's control block spans three 128-byte lines");

ShmSegment::ShmSegment(int rank, int size, const ShmWaitPolicy& policy,
                       std::shared_ptr<PeerMonitor> monitor)
    : rank_(rank), size_(size), policy_(policy), monitor_(std::move(monitor)),
      owner_pid_(getpid()) {}

ShmSegment::~ShmSegment() {
  if (base_ == nullptr) return;
  // A forked child that exits normally runs this too; it must not declare
  // its parent's rank gone.
  if (getpid() == owner_pid_)
    Abandon("it shut its data plane down", FailureCause::PEER_FAILURE, job_rank_);
  munmap(base_, mapped_bytes_);
}

ShmHeader* ShmSegment::header() const { return reinterpret_cast<ShmHeader*>(base_); }

ShmRankControl* ShmSegment::control(int rank) const {
  return reinterpret_cast<ShmRankControl*>(base_ + RoundUp(sizeof(ShmHeader), 256)) + rank;
}

char* ShmSegment::slot(int rank, uint32_t step) const {
  return base_ + data_offset_ + (static_cast<int64_t>(rank) * 2 + (step & 1)) * slot_bytes_;
}

void ShmSegment::set_meta(uint32_t step, int64_t value) { control(rank_)->meta[step & 1] = value; }

int64_t ShmSegment::meta(int rank, uint32_t step) const { return control(rank)->meta[step & 1]; }

Status ShmSegment::Map(int fd, int64_t bytes) {
  // MAP_POPULATE faults the pages in now rather than in the first collective.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return Status::Unknown("tfring: " + Errno("mmap of the shared-memory segment"));
  base_ = static_cast<char*>(p);
  mapped_bytes_ = bytes;
  return Status::OK();
}

namespace {

// Byte offsets of the parts of a segment for `size` ranks.
void ComputeLayout(int size, int64_t chunk_bytes, int64_t* slot_bytes, int64_t* data_offset,
                   int64_t* total) {
  *slot_bytes = size * chunk_bytes;
  *data_offset = RoundUp(RoundUp(sizeof(ShmHeader), 256) + size * sizeof(ShmRankControl), kPage);
  *total = *data_offset + static_cast<int64_t>(size) * 2 * *slot_bytes;
}

}  // namespace

Status ShmSegment::InitAsCreator(const ShmLayout& layout) {
  // The pages are zero; construct the atomics properly all the same.
  ShmHeader* h = new (base_) ShmHeader();
  h->magic = kMagic;
  h->version = kVersion;
  h->size = size_;
  h->chunk_bytes = layout.chunk_bytes;
  h->small_allreduce_bytes = layout.small_allreduce_bytes;
  ComputeLayout(size_, layout.chunk_bytes, &h->slot_bytes, &h->data_offset, &h->total_bytes);
  h->claimed.store(0);
  h->gone.store(0);
  for (int r = 0; r < size_; ++r) {
    ShmRankControl* c = new (control(r)) ShmRankControl();
    c->seq.store(0);
    c->sleepers.store(0);
    c->meta[0] = c->meta[1] = 0;
    for (uint64_t& w : c->cpus) w = 0;
  }
  return AdoptHeader();
}

Status ShmSegment::AdoptHeader() {
  const ShmHeader* h = header();
  if (mapped_bytes_ < static_cast<int64_t>(sizeof(ShmHeader)) || h->magic != kMagic ||
      h->version != kVersion) {
    return Status::Unknown("tfring: the shared-memory segment has an unexpected format "
                           "(ranks built from different tfring versions?)");
  }
  if (h->size != size_ || h->total_bytes != mapped_bytes_ || h->chunk_bytes <= 0 ||
      h->small_allreduce_bytes > h->slot_bytes) {
    return Status::Unknown("tfring: the shared-memory segment does not match this process set (" +
                           std::to_string(h->size) + " ranks in the segment, " +
                           std::to_string(size_) + " here)");
  }
  layout_.chunk_bytes = h->chunk_bytes;
  layout_.small_allreduce_bytes = h->small_allreduce_bytes;
  slot_bytes_ = h->slot_bytes;
  data_offset_ = h->data_offset;
  return Status::OK();
}

Status ShmSegment::Create(int rank, int size, const ShmLayout& requested,
                          const ShmWaitPolicy& policy, DataPlane* bootstrap,
                          std::shared_ptr<PeerMonitor> monitor, std::unique_ptr<ShmSegment>* out) {
  if (size < 1 || rank < 0 || rank >= size || bootstrap == nullptr) {
    return Status::InvalidArgument("tfring: bad arguments to the shared-memory segment set-up");
  }
  if (requested.chunk_bytes <= 0 || requested.chunk_bytes % kPage != 0 ||
      requested.small_allreduce_bytes < 0 ||
      requested.small_allreduce_bytes > size * requested.chunk_bytes) {
    return Status::InvalidArgument("tfring: bad shared-memory layout (chunk " +
                                   std::to_string(requested.chunk_bytes) + " bytes)");
  }
  std::unique_ptr<ShmSegment> seg(new ShmSegment(rank, size, policy, std::move(monitor)));
  Status local;
  // Rank 0 sends the name, or an empty string if it could not create one.
  char name[128] = {0};
  std::string created;
  int fd = -1;
  if (rank == 0) {
    created = UniqueName();
    fd = shm_open(created.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      local = Status::Unknown("tfring: " + Errno(("shm_open(" + created + ")").c_str()));
      created.clear();
    } else {
      int64_t slot_bytes, data_offset, total;
      ComputeLayout(size, requested.chunk_bytes, &slot_bytes, &data_offset, &total);
      // fallocate rather than only ftruncate: a /dev/shm too small for the
      // segment must fail here, not raise SIGBUS on first touch.
      int rc = ftruncate(fd, total) != 0 ? errno : posix_fallocate(fd, 0, total);
      if (rc != 0) {
        errno = rc;
        local = Status::Unknown("tfring: " + Errno(("cannot size the shared-memory segment (" +
                                                    std::to_string(total) +
                                                    " bytes in /dev/shm)").c_str()));
      }
      if (local.ok()) local = seg->Map(fd, total);
      if (local.ok()) local = seg->InitAsCreator(requested);
      if (local.ok()) std::snprintf(name, sizeof name, "%s", created.c_str());
    }
  }
  Status s = bootstrap->Broadcast(name, sizeof name, 0);
  if (s.ok() && rank != 0) {
    if (name[0] == 0) {
      local = Status::Unknown("tfring: rank 0 could not create the shared-memory segment (see its log)");
    } else {
      name[sizeof name - 1] = 0;
      fd = shm_open(name, O_RDWR, 0);
      struct stat st;
      if (fd < 0) {
        local = Status::Unknown("tfring: " + Errno((std::string("shm_open(") + name + ")").c_str()));
      } else if (fstat(fd, &st) != 0) {
        local = Status::Unknown("tfring: " + Errno("fstat of the shared-memory segment"));
      } else {
        local = seg->Map(fd, st.st_size);
        if (local.ok()) local = seg->AdoptHeader();
      }
    }
  }
  if (fd >= 0) close(fd);  // the mapping keeps the memory
  if (local.ok()) seg->PublishCpus();
  // Everyone has mapped (or failed) before this returns, so the name can go.
  int32_t ok = local.ok() ? 1 : 0;
  if (s.ok()) s = bootstrap->Allreduce(&ok, 1, DataType::INT32, ReduceOp::MIN);
  if (!created.empty()) shm_unlink(created.c_str());
  if (!s.ok()) return s;
  if (!local.ok()) return local;
  if (!ok) {
    return Status::Unknown("tfring: another rank could not map the shared-memory segment (see its log)");
  }
  seg->ChooseSpin();  // every rank's CPUs are in the segment now
  *out = std::move(seg);
  return Status::OK();
}

void ShmSegment::PublishCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  uint64_t* mask = control(rank_)->cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    mask[0] = 1;  // unknown: count as one CPU, the cautious guess
    return;
  }
  for (int cpu = 0; cpu < kCpuMaskWords * 64 && cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) mask[cpu / 64] |= uint64_t{1} << (cpu % 64);
  }
}

void ShmSegment::ChooseSpin() {
  // Ranks bound to one core each are not oversubscribed, though each alone
  // sees a single CPU: count the union of everyone's CPUs.
  cpus_ = 0;
  for (int w = 0; w < kCpuMaskWords; ++w) {
    uint64_t all = 0;
    for (int r = 0; r < size_; ++r) all |= control(r)->cpus[w];
    cpus_ += __builtin_popcountll(all);
  }
  if (policy_.spin_ns < 0) {
    policy_.spin_ns = oversubscribed() ? ShmWaitPolicy::kOversubscribedSpinNs : ShmWaitPolicy::kSpinNs;
  }
}

void ShmSegment::Publish(uint32_t step) {
  ShmRankControl* c = control(rank_);
  // seq_cst on both sides (here and in BlockingWait) forms a Dekker pair: either
  // the sleeper sees the new value, or we see it registered and wake it.
  c->seq.store(step, std::memory_order_seq_cst);
  if (c->sleepers.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&c->seq);
}

Status ShmSegment::WaitAll(uint32_t step) {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) TFRING_RETURN_IF_ERROR(WaitFor(p, step));
  }
  return Status::OK();
}

Status ShmSegment::WaitFor(int peer, uint32_t step) {
  if (Reached(control(peer)->seq.load(std::memory_order_acquire), step)) return Status::OK();
  return SlowWait(peer, step);
}

Status ShmSegment::SlowWait(int peer, uint32_t step) {
  std::atomic<uint32_t>& seq = control(peer)->seq;
  // 1. Spin: with a core per rank the peer is usually microseconds away (or
  //    as far as the skew with which ranks enter a collective), and blocking
  //    costs more: a futex wake-up, and on a VM waking an idle vCPU, can
  //    take tens of microseconds. But when spinning keeps failing (the host
  //    is busy, or the peer waits for this very core), poll only briefly for
  //    a while: at most kFailedSpins full spins in a row are wasted.
  int64_t spin_ns = policy_.spin_ns;
  if (short_spins_left_ > 0) {
    --short_spins_left_;
    spin_ns = std::min(spin_ns, kShortSpinNs);
  }
  const auto start = std::chrono::steady_clock::now();
  const auto budget = std::chrono::nanoseconds(spin_ns);
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (Reached(seq.load(std::memory_order_acquire), step)) {
        failed_spins_ = 0;
        return Status::OK();
      }
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() - start >= budget) break;
  }
  if (spin_ns > kShortSpinNs && ++failed_spins_ >= kFailedSpins) {
    failed_spins_ = 0;
    short_spins_left_ = kShortSpinWaits;
  }
  return BlockingWait(peer, step);
}

Status ShmSegment::BlockingWait(int peer, uint32_t step) {
  std::atomic<uint32_t>& seq = control(peer)->seq;
  // 2. Yield: when ranks outnumber cores the peer may need our core.
  for (int i = 0; i < policy_.yields; ++i) {
    sched_yield();
    if (Reached(seq.load(std::memory_order_acquire), step)) return Status::OK();
  }
  // 3. Sleep in the kernel until the peer publishes, waking now and then to
  //    ask whether it is still alive.
  ShmHeader* h = header();
  while (true) {
    control(peer)->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = seq.load(std::memory_order_seq_cst);
    if (!Reached(v, step) && h->gone.load(std::memory_order_acquire) == 0) {
      FutexWait(&seq, v, kSleepSliceNs);
    }
    control(peer)->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (Reached(seq.load(std::memory_order_acquire), step)) return Status::OK();
    const uint32_t gone = h->gone.load(std::memory_order_acquire);
    if (gone != 0) return AbandonedStatus(static_cast<int>(gone) - 1);
    if (monitor_) {
      Status s = monitor_->Check();
      if (!s.ok()) return s;
    }
  }
}

Status ShmSegment::AbandonedStatus(int who) const {
  const ShmHeader* h = header();
  return Status::Make(StatusCode::ABORTED, static_cast<FailureCause>(h->cause),
                      "tfring: rank " + std::to_string(who) +
                          " left the shared-memory data plane while rank " +
                          std::to_string(rank_) + " was waiting for it in a collective: " +
                          std::string(h->reason, strnlen(h->reason, kReasonBytes)),
                      h->failed_rank);
}

void ShmSegment::Abandon(const std::string& reason, FailureCause cause, int failed_rank) {
  if (abandoned_ || base_ == nullptr) return;
  abandoned_ = true;
  ShmHeader* h = header();
  uint32_t expected = 0;
  if (h->claimed.compare_exchange_strong(expected, 1)) {
    std::snprintf(h->reason, kReasonBytes, "%s", reason.c_str());
    h->cause = static_cast<int32_t>(cause);
    h->failed_rank = failed_rank;
    h->gone.store(static_cast<uint32_t>(rank_) + 1, std::memory_order_release);
  }
  for (int p = 0; p < size_; ++p) FutexWakeAll(&control(p)->seq);
}

}  // namespace tfring
