// Compiled only into a GPU build (TFRING_WITH_NCCL) and into its unit test
// (TFRING_NCCL_PLANE_LOGIC, tests/common/test_nccl_cpp.py); the CPU
// library's source glob picks this file up, and it then compiles to nothing.
#if defined(TFRING_WITH_NCCL) || defined(TFRING_NCCL_PLANE_LOGIC)

#include "nccl_data_plane.h"

#include <numeric>
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

// --- Data plane ---------------------------------------------------------------

NcclDataPlane::NcclDataPlane(NcclCommunicators* comms, int32_t key, int rank, int size,
                             BroadcastBytesFn broadcast)
    : comms_(comms),
      api_(comms->api()),
      key_(key),
      rank_(rank),
      size_(size),
      broadcast_(std::move(broadcast)),
      events_(std::make_shared<GpuEventPool>(comms->api())) {}

NcclDataPlane::~NcclDataPlane() { comms_->Remove(key_); }

Status NcclDataPlane::Cuda(int error, const std::string& call) {
  return error == 0 ? Status::OK() : CudaErrorToStatus(error, call, api_->CudaErrorString(error));
}

Status NcclDataPlane::Check(NcclResult r, NcclComm comm, const std::string& call) {
  if (r == NcclResult::kSuccess) return Status::OK();
  if (r == NcclResult::kInProgress) {
    // A non-blocking communicator may still be queueing the call; the next
    // call on it must wait until it has.
    in_progress_waits_.fetch_add(1, std::memory_order_relaxed);
    return comms_->WaitReady(comm, call, std::chrono::minutes(5));
  }
  Status s = NcclResultToStatus(r, call, api_->ErrorString(r), api_->LastError(comm));
  // A peer or the network failed: the other communicators cannot be trusted
  // either, and aborting them ends whatever waits on the lost peer.
  if (s.code() == StatusCode::ABORTED) comms_->AbortAll();
  return s;
}

Status NcclDataPlane::Prepare(int device, NcclComm* comm) {
  TFRING_RETURN_IF_ERROR(Cuda(api_->SetDevice(device), "cudaSetDevice"));
  return comms_->Get(key_, device, rank_, size_, broadcast_, comm);
}

Status NcclDataPlane::Finish(NcclComm comm, GpuStream stream, const std::string& what,
                             GpuCompletion* done) {
  if (done == nullptr) return Status::InProgress();
  done->Reset();
  GpuEvent event = nullptr;
  TFRING_RETURN_IF_ERROR(Cuda(events_->Acquire(&event), "cudaEventCreateWithFlags"));
  int err = api_->EventRecord(event, stream);
  if (err != 0) {
    events_->Release(event);
    return Cuda(err, "cudaEventRecord");
  }
  done->pool_ = events_;
  done->event_ = event;
  done->comm_ = comm;
  done->what_ = what;
  return Status::OK();
}

Status NcclDataPlane::Poll(GpuCompletion* done) {
  if (!done->pending()) return Status::OK();
  int err = 0;
  const EventState state = api_->EventQuery(done->event_, &err);
  if (state == EventState::kDone && !comms_->abort_flag()->requested()) {
    done->Reset();
    return Status::OK();
  }
  if (state == EventState::kError) {
    const std::string what = done->what_;
    done->Reset();
    return Cuda(err, "waiting for NCCL " + what);
  }
  Status s = Status::InProgress();
  if (done->comm_ != nullptr) {
    s = comms_->CheckAsync(done->comm_, "NCCL " + done->what_);
  } else if (comms_->abort_flag()->requested()) {
    comms_->AbortAll();
    s = Status::Aborted("tfring: NCCL communication aborted: " + comms_->abort_flag()->reason());
  }
  if (!s.ok() && !s.in_progress()) {
    done->Reset();
    return s;
  }
  return Status::InProgress();
}

Status NcclDataPlane::CheckReduction(DataType dtype, ReduceOp op, const char* collective) const {
  if (op != ReduceOp::SUM && op != ReduceOp::MIN && op != ReduceOp::MAX &&
      op != ReduceOp::PRODUCT) {
    return Status::InvalidArgument(std::string("tfring: the NCCL plane cannot run ") + collective +
                                   " with op " + ReduceOpName(op));
  }
  if (!api_->SupportsDataType(dtype)) {
    return Status::InvalidArgument(std::string("tfring: NCCL cannot reduce ") +
                                   DataTypeName(dtype) + " tensors (" + collective + ")");
  }
  return Status::OK();
}

namespace {

std::vector<int64_t> Offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> off(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) off[i + 1] = off[i] + sizes[i];
  return off;
}

bool AllEqual(const std::vector<int64_t>& v) {
  for (int64_t x : v)
    if (x != v[0]) return false;
  return true;
}

}  // namespace

// --- DataPlane -------------------------------------------------------------

Status NcclDataPlane::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                                ReduceOp op) {
  return Allreduce(context_.device, context_.stream, input, output, count, dtype, op, nullptr);
}

Status NcclDataPlane::Allgather(const void* send, void* recv,
                                const std::vector<int64_t>& recv_bytes) {
  return Allgather(context_.device, context_.stream, send, recv, recv_bytes, nullptr);
}

Status NcclDataPlane::Broadcast(void* buffer, int64_t bytes, int root) {
  return Broadcast(context_.device, context_.stream, buffer, buffer, bytes, root, nullptr);
}

Status NcclDataPlane::BroadcastOutOfPlace(const void* input, void* output, int64_t bytes,
                                          int root) {
  return Broadcast(context_.device, context_.stream, input, output, bytes, root, nullptr);
}

Status NcclDataPlane::Alltoall(const void* send, const std::vector<int64_t>& send_bytes,
                               void* recv, const std::vector<int64_t>& recv_bytes) {
  return Alltoall(context_.device, context_.stream, send, send_bytes, recv, recv_bytes, nullptr);
}

Status NcclDataPlane::Reducescatter(const void* send, void* recv,
                                    const std::vector<int64_t>& recv_counts, DataType dtype,
                                    ReduceOp op) {
  return Reducescatter(context_.device, context_.stream, send, recv, recv_counts, dtype, op,
                       nullptr);
}

Status NcclDataPlane::Barrier() {
  return Status::InvalidArgument("tfring: the NCCL plane has no barrier; barriers run on the "
                                 "host planes");
}

// --- The collectives ---------------------------------------------------------

Status NcclDataPlane::Allreduce(int device, GpuStream stream, const void* send, void* recv,
                                int64_t count, DataType dtype, ReduceOp op, GpuCompletion* done) {
  TFRING_RETURN_IF_ERROR(CheckReduction(dtype, op, "allreduce"));
  NcclComm comm = nullptr;
  TFRING_RETURN_IF_ERROR(Prepare(device, &comm));
  if (count > 0) {
    TFRING_RETURN_IF_ERROR(Check(api_->AllReduce(send, recv, count, dtype, op, comm, stream),
                                 comm, "ncclAllReduce"));
  }
  return Finish(comm, stream, "allreduce", done);
}

Status NcclDataPlane::Allgather(int device, GpuStream stream, const void* send, void* recv,
                                const std::vector<int64_t>& recv_bytes, GpuCompletion* done) {
  if (static_cast<int>(recv_bytes.size()) != size_) {
    return Status::InvalidArgument("tfring: NCCL allgather got " +
                                   std::to_string(recv_bytes.size()) + " sizes for " +
                                   std::to_string(size_) + " ranks");
  }
  NcclComm comm = nullptr;
  TFRING_RETURN_IF_ERROR(Prepare(device, &comm));
  const std::vector<int64_t> off = Offsets(recv_bytes);
  char* out = static_cast<char*>(recv);
  if (AllEqual(recv_bytes)) {
    // NCCL's own allgather (ring/tree algorithms) needs equal counts.
    if (recv_bytes[0] > 0) {
      TFRING_RETURN_IF_ERROR(
          Check(api_->AllGather(send, out, recv_bytes[0], comm, stream), comm, "ncclAllGather"));
    }
  } else {
    // Ragged: one grouped send/recv per peer. Padding every block to the
    // largest would move (and allocate) size * max bytes per rank, then need
    // a compaction pass; with uneven splits that is often several times the
    // real data. The grouped point-to-point form moves exactly the bytes.
    if (recv_bytes[rank_] > 0) {
      TFRING_RETURN_IF_ERROR(
          Cuda(api_->MemcpyAsync(out + off[rank_], send, recv_bytes[rank_], stream),
               "cudaMemcpyAsync(own allgather block)"));
    }
    TFRING_RETURN_IF_ERROR(Check(api_->GroupStart(), comm, "ncclGroupStart"));
    Status s;
    for (int peer = 0; peer < size_ && s.ok(); ++peer) {
      if (peer == rank_) continue;
      if (recv_bytes[rank_] > 0)
        s = Check(api_->Send(send, recv_bytes[rank_], peer, comm, stream), comm, "ncclSend");
      if (s.ok() && recv_bytes[peer] > 0)
        s = Check(api_->Recv(out + off[peer], recv_bytes[peer], peer, comm, stream), comm,
                  "ncclRecv");
    }
    Status end = Check(api_->GroupEnd(), comm, "ncclGroupEnd(allgather)");
    TFRING_RETURN_IF_ERROR(s);
    TFRING_RETURN_IF_ERROR(end);
  }
  return Finish(comm, stream, "allgather", done);
}

Status NcclDataPlane::Broadcast(int device, GpuStream stream, const void* send, void* recv,
                                int64_t bytes, int root, GpuCompletion* done) {
  if (root < 0 || root >= size_) {
    return Status::InvalidArgument("tfring: broadcast root " + std::to_string(root) +
                                   " is not a rank of a process set of " + std::to_string(size_));
  }
  NcclComm comm = nullptr;
  TFRING_RETURN_IF_ERROR(Prepare(device, &comm));
  if (bytes > 0) {
    TFRING_RETURN_IF_ERROR(
        Check(api_->Broadcast(send, recv, bytes, root, comm, stream), comm, "ncclBroadcast"));
  }
  return Finish(comm, stream, "broadcast", done);
}

Status NcclDataPlane::Alltoall(int device, GpuStream stream, const void* send,
                               const std::vector<int64_t>& send_bytes, void* recv,
                               const std::vector<int64_t>& recv_bytes, GpuCompletion* done) {
  if (static_cast<int>(send_bytes.size()) != size_ ||
      static_cast<int>(recv_bytes.size()) != size_) {
    return Status::InvalidArgument("tfring: NCCL alltoall needs one send and one receive size "
                                   "per rank (" + std::to_string(size_) + " ranks)");
  }
  NcclComm comm = nullptr;
  TFRING_RETURN_IF_ERROR(Prepare(device, &comm));
  const std::vector<int64_t> soff = Offsets(send_bytes), roff = Offsets(recv_bytes);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  if (send_bytes[rank_] != recv_bytes[rank_]) {
    return Status::InvalidArgument("tfring: alltoall sends " + std::to_string(send_bytes[rank_]) +
                                   " bytes to itself but expects " +
                                   std::to_string(recv_bytes[rank_]));
  }
  if (send_bytes[rank_] > 0) {
    TFRING_RETURN_IF_ERROR(Cuda(
        api_->MemcpyAsync(out + roff[rank_], in + soff[rank_], send_bytes[rank_], stream),
        "cudaMemcpyAsync(own alltoall block)"));
  }
  if (size_ > 1) {
    TFRING_RETURN_IF_ERROR(Check(api_->GroupStart(), comm, "ncclGroupStart"));
    Status s;
    for (int peer = 0; peer < size_ && s.ok(); ++peer) {
      if (peer == rank_) continue;
      if (send_bytes[peer] > 0)
        s = Check(api_->Send(in + soff[peer], send_bytes[peer], peer, comm, stream), comm,
                  "ncclSend");
      if (s.ok() && recv_bytes[peer] > 0)
        s = Check(api_->Recv(out + roff[peer], recv_bytes[peer], peer, comm, stream), comm,
                  "ncclRecv");
    }
    Status end = Check(api_->GroupEnd(), comm, "ncclGroupEnd(alltoall)");
    TFRING_RETURN_IF_ERROR(s);
    TFRING_RETURN_IF_ERROR(end);
  }
  return Finish(comm, stream, "alltoall", done);
}

Status NcclDataPlane::Reducescatter(int device, GpuStream stream, const void* send, void* recv,
                                    const std::vector<int64_t>& recv_counts, DataType dtype,
                                    ReduceOp op, GpuCompletion* done) {
  if (static_cast<int>(recv_counts.size()) != size_) {
    return Status::InvalidArgument("tfring: NCCL reducescatter got " +
                                   std::to_string(recv_counts.size()) + " counts for " +
                                   std::to_string(size_) + " ranks");
  }
  TFRING_RETURN_IF_ERROR(CheckReduction(dtype, op, "reducescatter"));
  NcclComm comm = nullptr;
  TFRING_RETURN_IF_ERROR(Prepare(device, &comm));
  const std::vector<int64_t> off = Offsets(recv_counts);
  const int64_t total = off.back(), esize = DataTypeSize(dtype);
  if (total > 0) {
    const char* in = static_cast<const char*>(send);
    if (AllEqual(recv_counts)) {
      TFRING_RETURN_IF_ERROR(Check(
          api_->ReduceScatter(in, recv, recv_counts[0], dtype, op, comm, stream), comm,
          "ncclReduceScatter"));
    } else {
      // Uneven blocks (rows not divisible by the set size): one reduce per
      // block, rooted at the rank that keeps it, in one group so that NCCL
      // runs them together.
      TFRING_RETURN_IF_ERROR(Check(api_->GroupStart(), comm, "ncclGroupStart"));
      Status s;
      for (int r = 0; r < size_ && s.ok(); ++r) {
        if (recv_counts[r] == 0) continue;
        s = Check(api_->Reduce(in + off[r] * esize, recv, recv_counts[r], dtype, op, r,
                               comm, stream),
                  comm, "ncclReduce");
      }
      Status end = Check(api_->GroupEnd(), comm, "ncclGroupEnd(reducescatter)");
      TFRING_RETURN_IF_ERROR(s);
      TFRING_RETURN_IF_ERROR(end);
    }
  }
  return Finish(comm, stream, "reducescatter", done);
}

}  // namespace tfring

#endif  // GPU build
