// Compiled only into a GPU build (TFRING_WITH_NCCL) and into its unit test
// (TFRING_NCCL_PLANE_LOGIC, tests/common/test_nccl_cpp.py); the CPU
// library's source glob picks this file up, and it then compiles to nothing.
#if defined(TFRING_WITH_NCCL) || defined(TFRING_NCCL_PLANE_LOGIC)

#include "nccl_data_plane.h"

#include <numeric>
#include <thread>

namespace tfring {

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

Status NcclDataPlane::Mark(int device, GpuStream stream, const std::string& what,
                           GpuCompletion* done) {
  NcclComm comm = nullptr;
  TFRING_RETURN_IF_ERROR(Prepare(device, &comm));
  return Finish(comm, stream, what, done);
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

Status NcclDataPlane::AllreduceGroup(const std::vector<ReduceSlot>& tensors, DataType dtype,
                                     ReduceOp op) {
  TFRING_RETURN_IF_ERROR(CheckReduction(dtype, op, "allreduce"));
  NcclComm comm = nullptr;
  TFRING_RETURN_IF_ERROR(Prepare(context_.device, &comm));
  GpuStream stream = context_.stream;
  TFRING_RETURN_IF_ERROR(Check(api_->GroupStart(), comm, "ncclGroupStart"));
  Status queued = Status::OK();
  for (const ReduceSlot& t : tensors) {
    if (t.count == 0) continue;
    queued = Check(api_->AllReduce(t.input, t.output, t.count, dtype, op, comm, stream), comm,
                   "ncclAllReduce (grouped)");
    if (!queued.ok()) break;
  }
  // The group is closed even after a failed call, so that the communicator
  // is not left inside it.
  Status ended = Check(api_->GroupEnd(), comm, "ncclGroupEnd");
  TFRING_RETURN_IF_ERROR(queued);
  TFRING_RETURN_IF_ERROR(ended);
  return Finish(comm, stream, "allreduce", nullptr);
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
