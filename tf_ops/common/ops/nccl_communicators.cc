// Compiled only into a GPU build (TFRING_WITH_NCCL) and into its unit test
// (TFRING_NCCL_PLANE_LOGIC, tests/common/test_nccl_cpp.py); the CPU
// library's source glob picks this file up, and it then compiles to nothing.
#if defined(TFRING_WITH_NCCL) || defined(TFRING_NCCL_PLANE_LOGIC)

#include "nccl_communicators.h"

#include <thread>

namespace tfring {

const char* NcclResultName(NcclResult r) {
  switch (r) {
    case NcclResult::kSuccess: return "ncclSuccess";
    case NcclResult::kUnhandledCudaError: return "ncclUnhandledCudaError";
    case NcclResult::kSystemError: return "ncclSystemError";
    case NcclResult::kInternalError: return "ncclInternalError";
    case NcclResult::kInvalidArgument: return "ncclInvalidArgument";
    case NcclResult::kInvalidUsage: return "ncclInvalidUsage";
    case NcclResult::kRemoteError: return "ncclRemoteError";
    case NcclResult::kInProgress: return "ncclInProgress";
    case NcclResult::kTimeout: return "ncclTimeout";
  }
  return "unknown NCCL result";
}

Status NcclResultToStatus(NcclResult result, const std::string& call,
                          const std::string& error_string, const std::string& last_error) {
  if (result == NcclResult::kSuccess) return Status::OK();
  if (result == NcclResult::kInProgress) return Status::InProgress();
  std::string msg = "tfring: " + call + " failed: " + NcclResultName(result) + " (" +
                    std::to_string(static_cast<int>(result)) + ")";
  if (!error_string.empty()) msg += ": " + error_string;
  if (!last_error.empty() && last_error != error_string) msg += "; NCCL says: " + last_error;
  switch (result) {
    case NcclResult::kInvalidArgument:
    case NcclResult::kInvalidUsage:
      return Status::InvalidArgument(msg);
    case NcclResult::kRemoteError:
    case NcclResult::kSystemError:
    case NcclResult::kTimeout:
      return Status::Aborted(msg + " (a peer process or the network failed)");
    default:
      return Status::Unknown(msg);
  }
}

Status CudaErrorToStatus(int error, const std::string& call, const std::string& error_string) {
  if (error == 0) return Status::OK();
  return Status::Unknown("tfring: " + call + " failed: CUDA error " + std::to_string(error) +
                         (error_string.empty() ? "" : ": " + error_string));
}

namespace {
// The same cause with more context.
Status Annotate(const Status& s, const std::string& suffix) {
  const std::string m = s.message() + suffix;
  switch (s.code()) {
    case StatusCode::OK: return s;
    case StatusCode::IN_PROGRESS: return s;
    case StatusCode::ABORTED: return Status::Aborted(m);
    case StatusCode::INVALID_ARGUMENT: return Status::InvalidArgument(m);
    case StatusCode::PRECONDITION_ERROR: return Status::PreconditionError(m);
    case StatusCode::UNKNOWN: break;
  }
  return Status::Unknown(m);
}
}  // namespace

// --- Abort flag -------------------------------------------------------------

void NcclAbortFlag::Request(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reason_.empty()) reason_ = reason;
  }
  requested_.store(true, std::memory_order_release);
}

void NcclAbortFlag::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  reason_.clear();
  requested_.store(false, std::memory_order_release);
}

std::string NcclAbortFlag::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

// --- Communicators ------------------------------------------------------------

NcclCommunicators::NcclCommunicators(NcclApi* api, std::shared_ptr<NcclAbortFlag> abort,
                                     std::chrono::milliseconds init_timeout)
    : api_(api), abort_(std::move(abort)), init_timeout_(init_timeout) {}

NcclCommunicators::~NcclCommunicators() {
  std::map<std::pair<int32_t, int>, Entry> comms;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comms.swap(comms_);
  }
  // After an abort request, destroying could wait on work that a dead peer
  // never completes.
  const bool abort = abort_->requested();
  for (auto& kv : comms) {
    if (abort) {
      api_->CommAbort(kv.second.comm);
    } else {
      api_->CommDestroy(kv.second.comm);
    }
  }
}

size_t NcclCommunicators::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return comms_.size();
}

Status NcclCommunicators::AbortedStatus() const {
  std::string reason = abort_->reason();
  return Status::Aborted("tfring: NCCL communication aborted" +
                         (reason.empty() ? std::string() : ": " + reason));
}

void NcclCommunicators::AbortOne(NcclComm comm) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = comms_.begin(); it != comms_.end();) {
      it = it->second.comm == comm ? comms_.erase(it) : std::next(it);
    }
  }
  api_->CommAbort(comm);
}

void NcclCommunicators::AbortAll() {
  std::map<std::pair<int32_t, int>, Entry> comms;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comms.swap(comms_);
  }
  for (auto& kv : comms) api_->CommAbort(kv.second.comm);
}

NcclComm NcclCommunicators::Find(int32_t set_id, int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(std::make_pair(set_id, device));
  return it == comms_.end() ? nullptr : it->second.comm;
}

void NcclCommunicators::Remove(int32_t set_id) {
  std::vector<NcclComm> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = comms_.begin(); it != comms_.end();) {
      if (it->first.first == set_id) {
        gone.push_back(it->second.comm);
        it = comms_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (NcclComm c : gone) api_->CommDestroy(c);
}

Status NcclCommunicators::Get(int32_t set_id, int device, int rank, int size,
                              const BroadcastBytesFn& broadcast, NcclComm* comm) {
  if (abort_->requested()) {
    AbortAll();
    return AbortedStatus();
  }
  const auto key = std::make_pair(set_id, device);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comms_.find(key);
    if (it != comms_.end()) {
      if (it->second.rank != rank || it->second.size != size) {
        return Status::Unknown(
            "tfring: the NCCL communicator of process set " + std::to_string(set_id) +
            " on GPU " + std::to_string(device) + " was made for rank " +
            std::to_string(it->second.rank) + " of " + std::to_string(it->second.size) +
            ", but is asked for rank " + std::to_string(rank) + " of " + std::to_string(size) +
            " (a removed process set's communicators must be removed with it)");
      }
      *comm = it->second.comm;
      return Status::OK();
    }
  }
  Entry entry;
  Status s = Create(device, rank, size, broadcast, &entry);
  if (!s.ok()) {
    return Annotate(s, " (creating the NCCL communicator of process set " +
                           std::to_string(set_id) + " on GPU " + std::to_string(device) + ")");
  }
  std::lock_guard<std::mutex> lock(mu_);
  comms_[key] = entry;
  *comm = entry.comm;
  return Status::OK();
}

Status NcclCommunicators::Create(int device, int rank, int size,
                                 const BroadcastBytesFn& broadcast, Entry* entry) {
  std::string id;
  if (rank == 0) {
    NcclResult r = api_->GetUniqueId(&id);
    if (r != NcclResult::kSuccess) {
      Status failed = NcclResultToStatus(r, "ncclGetUniqueId", api_->ErrorString(r),
                                         api_->LastError(nullptr));
      // The other ranks wait for the id: an empty one tells them to give up.
      std::string none;
      broadcast(&none);
      return failed;
    }
    if (id.size() != kNcclUniqueIdBytes) {
      std::string none;
      broadcast(&none);
      return Status::Unknown("tfring: ncclGetUniqueId gave " + std::to_string(id.size()) +
                             " bytes, expected " + std::to_string(kNcclUniqueIdBytes));
    }
  }
  Status s = broadcast(&id);
  if (!s.ok()) return s;
  if (id.empty()) {
    return Status::Unknown(
        "tfring: rank 0 of the process set could not create an NCCL unique id (its log and "
        "error say why)");
  }
  if (id.size() != kNcclUniqueIdBytes) {
    return Status::Unknown("tfring: received an NCCL unique id of " + std::to_string(id.size()) +
                           " bytes from rank 0, expected " + std::to_string(kNcclUniqueIdBytes));
  }
  int err = api_->SetDevice(device);
  if (err != 0) return CudaErrorToStatus(err, "cudaSetDevice(" + std::to_string(device) + ")",
                                         api_->CudaErrorString(err));
  NcclComm comm = nullptr;
  NcclResult r = api_->CommInitRank(&comm, size, id, rank);
  const std::string call = "ncclCommInitRankConfig(rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + ")";
  if (r == NcclResult::kInProgress || r == NcclResult::kSuccess) {
    // A non-blocking communicator may return ncclSuccess while it is still
    // forming (NCCL 2.28 does): it is ready only when its async state is.
    TFRING_RETURN_IF_ERROR(WaitReady(comm, call, init_timeout_));
  } else {
    Status failed = NcclResultToStatus(r, call, api_->ErrorString(r), api_->LastError(comm));
    if (comm != nullptr) api_->CommAbort(comm);
    return failed;
  }
  entry->comm = comm;
  entry->rank = rank;
  entry->size = size;
  return Status::OK();
}

Status NcclCommunicators::CheckAsync(NcclComm comm, const std::string& call) {
  if (abort_->requested()) {
    AbortOne(comm);
    AbortAll();
    return AbortedStatus();
  }
  NcclResult async = NcclResult::kSuccess;
  NcclResult r = api_->CommGetAsyncError(comm, &async);
  if (r != NcclResult::kSuccess) async = r;
  if (async == NcclResult::kSuccess) return Status::OK();
  if (async == NcclResult::kInProgress) return Status::InProgress();
  Status failed = NcclResultToStatus(async, call, api_->ErrorString(async), api_->LastError(comm));
  // A communicator with an asynchronous error cannot be used again, and its
  // pending work may never finish.
  AbortOne(comm);
  return failed;
}

Status NcclCommunicators::CheckDevice(int device) {
  std::vector<NcclComm> on_device;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& kv : comms_) {
      if (kv.first.second == device) on_device.push_back(kv.second.comm);
    }
  }
  if (on_device.empty() && abort_->requested()) {
    AbortAll();
    return AbortedStatus();
  }
  Status pending = Status::OK();
  for (NcclComm c : on_device) {
    Status s = CheckAsync(c, "NCCL collective");
    if (!s.ok() && !s.in_progress()) return s;
    if (s.in_progress()) pending = s;
  }
  return pending;
}

Status NcclCommunicators::WaitReady(NcclComm comm, const std::string& call,
                                    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int spins = 0;; ++spins) {
    Status s = CheckAsync(comm, call);
    if (!s.in_progress()) return s;
    if (std::chrono::steady_clock::now() > deadline) {
      AbortOne(comm);
      return Status::Aborted("tfring: " + call + " did not finish within " +
                             std::to_string(timeout.count() / 1000.0) +
                             " s (a peer may have died or not joined); NCCL communicator aborted");
    }
    // Enqueueing usually finishes within microseconds; forming a
    // communicator can take seconds.
    if (spins < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

// --- Completion -------------------------------------------------------------

GpuEventPool::~GpuEventPool() {
  for (GpuEvent e : free_) api_->EventDestroy(e);
}

int GpuEventPool::Acquire(GpuEvent* event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      *event = free_.back();
      free_.pop_back();
      return 0;
    }
  }
  return api_->EventCreate(event);
}

void GpuEventPool::Release(GpuEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(event);
}

GpuCompletion::~GpuCompletion() { Reset(); }

GpuCompletion::GpuCompletion(GpuCompletion&& other) noexcept { *this = std::move(other); }

GpuCompletion& GpuCompletion::operator=(GpuCompletion&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::move(other.pool_);
    event_ = other.event_;
    comm_ = other.comm_;
    what_ = std::move(other.what_);
    other.event_ = nullptr;
    other.comm_ = nullptr;
  }
  return *this;
}

void GpuCompletion::Reset() {
  // A recorded event may be re-recorded once its work is done or abandoned:
  // cudaEventRecord replaces the captured work.
  if (event_ != nullptr && pool_) pool_->Release(event_);
  event_ = nullptr;
  comm_ = nullptr;
  pool_.reset();
}

}  // namespace tfring

#endif  // GPU build
