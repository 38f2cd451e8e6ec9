// Compiled only into a GPU build (TFRING_WITH_NCCL); the CPU library's
// source glob picks this file up, and it then compiles to nothing.
#ifdef TFRING_WITH_NCCL

#include "cuda_nccl_api.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>

#include "gpu_kernels.h"

namespace tfring {
namespace {

// Our enum mirrors NCCL's documented codes so that the plane's error mapping
// can be unit-tested without nccl.h; keep them in step.
static_assert(static_cast<int>(NcclResult::kSuccess) == ncclSuccess, "NCCL result codes");
static_assert(static_cast<int>(NcclResult::kUnhandledCudaError) == ncclUnhandledCudaError, "");
static_assert(static_cast<int>(NcclResult::kSystemError) == ncclSystemError, "");
static_assert(static_cast<int>(NcclResult::kInternalError) == ncclInternalError, "");
static_assert(static_cast<int>(NcclResult::kInvalidArgument) == ncclInvalidArgument, "");
static_assert(static_cast<int>(NcclResult::kInvalidUsage) == ncclInvalidUsage, "");
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError, "");
static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress, "");
static_assert(kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");
// ncclTimeout (8) is newer than some NCCL releases in use (2.28 has none).

NcclResult R(ncclResult_t r) { return static_cast<NcclResult>(r); }
ncclComm_t C(NcclComm c) { return static_cast<ncclComm_t>(c); }
cudaStream_t S(GpuStream s) { return static_cast<cudaStream_t>(s); }

// -1 when NCCL has no such type.
int NcclType(DataType dtype) {
  switch (dtype) {
    case DataType::INT8: return ncclInt8;
    case DataType::UINT8: return ncclUint8;
    case DataType::INT32: return ncclInt32;
    case DataType::INT64: return ncclInt64;
    case DataType::FLOAT16: return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case DataType::BFLOAT16: return ncclBfloat16;
#endif
    case DataType::FLOAT32: return ncclFloat32;
    case DataType::FLOAT64: return ncclFloat64;
    default: return -1;
  }
}

int NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return ncclSum;
    case ReduceOp::MIN: return ncclMin;
    case ReduceOp::MAX: return ncclMax;
    case ReduceOp::PRODUCT: return ncclProd;
    default: return -1;
  }
}

class CudaNcclApi : public NcclApi {
 public:
  NcclResult GetUniqueId(std::string* id) override {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r == ncclSuccess) id->assign(u.internal, NCCL_UNIQUE_ID_BYTES);
    return R(r);
  }
  NcclResult CommInitRank(NcclComm* comm, int nranks, const std::string& id, int rank) override {
    if (id.size() != NCCL_UNIQUE_ID_BYTES) return NcclResult::kInvalidArgument;
    ncclUniqueId u;
    std::memcpy(u.internal, id.data(), NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    // Non-blocking: every NCCL call returns at once, and a wait is our own
    // poll loop, which can abort the communicator when a peer has died.
    config.blocking = 0;
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&c, nranks, u, rank, &config);
    *comm = c;
    return R(r);
  }
  NcclResult CommGetAsyncError(NcclComm comm, NcclResult* async) override {
    ncclResult_t a = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(C(comm), &a);
    *async = R(a);
    return R(r);
  }
  NcclResult CommAbort(NcclComm comm) override { return R(ncclCommAbort(C(comm))); }
  NcclResult CommDestroy(NcclComm comm) override { return R(ncclCommDestroy(C(comm))); }
  std::string ErrorString(NcclResult r) override {
    const char* s = ncclGetErrorString(static_cast<ncclResult_t>(r));
    return s == nullptr ? "" : s;
  }
  std::string LastError(NcclComm comm) override {
    const char* s = ncclGetLastError(C(comm));
    return s == nullptr ? "" : s;
  }
  NcclResult GroupStart() override { return R(ncclGroupStart()); }
  NcclResult GroupEnd() override { return R(ncclGroupEnd()); }

  NcclResult AllReduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                       NcclComm comm, GpuStream stream) override {
    const int t = NcclType(dtype), o = NcclOp(op);
    if (t < 0 || o < 0) return NcclResult::kInvalidArgument;
    return R(ncclAllReduce(send, recv, static_cast<size_t>(count), static_cast<ncclDataType_t>(t),
                           static_cast<ncclRedOp_t>(o), C(comm), S(stream)));
  }
  NcclResult Reduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                    int root, NcclComm comm, GpuStream stream) override {
    const int t = NcclType(dtype), o = NcclOp(op);
    if (t < 0 || o < 0) return NcclResult::kInvalidArgument;
    return R(ncclReduce(send, recv, static_cast<size_t>(count), static_cast<ncclDataType_t>(t),
                        static_cast<ncclRedOp_t>(o), root, C(comm), S(stream)));
  }
  NcclResult ReduceScatter(const void* send, void* recv, int64_t recv_count, DataType dtype,
                           ReduceOp op, NcclComm comm, GpuStream stream) override {
    const int t = NcclType(dtype), o = NcclOp(op);
    if (t < 0 || o < 0) return NcclResult::kInvalidArgument;
    return R(ncclReduceScatter(send, recv, static_cast<size_t>(recv_count),
                               static_cast<ncclDataType_t>(t), static_cast<ncclRedOp_t>(o),
                               C(comm), S(stream)));
  }
  NcclResult AllGather(const void* send, void* recv, int64_t bytes, NcclComm comm,
                       GpuStream stream) override {
    return R(ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclUint8, C(comm), S(stream)));
  }
  NcclResult Broadcast(const void* send, void* recv, int64_t bytes, int root, NcclComm comm,
                       GpuStream stream) override {
    return R(ncclBroadcast(send, recv, static_cast<size_t>(bytes), ncclUint8, root, C(comm),
                           S(stream)));
  }
  NcclResult Send(const void* buf, int64_t bytes, int peer, NcclComm comm,
                  GpuStream stream) override {
    return R(ncclSend(buf, static_cast<size_t>(bytes), ncclUint8, peer, C(comm), S(stream)));
  }
  NcclResult Recv(void* buf, int64_t bytes, int peer, NcclComm comm, GpuStream stream) override {
    return R(ncclRecv(buf, static_cast<size_t>(bytes), ncclUint8, peer, C(comm), S(stream)));
  }
  bool SupportsDataType(DataType dtype) const override { return NcclType(dtype) >= 0; }

  int GetDevice(int* device) override { return static_cast<int>(cudaGetDevice(device)); }
  int SetDevice(int device) override { return static_cast<int>(cudaSetDevice(device)); }
  int Malloc(void** ptr, int64_t bytes) override {
    return static_cast<int>(cudaMalloc(ptr, static_cast<size_t>(bytes)));
  }
  int Free(void* ptr) override { return static_cast<int>(cudaFree(ptr)); }
  int MemcpyAsync(void* dst, const void* src, int64_t bytes, GpuStream stream) override {
    return static_cast<int>(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, S(stream)));
  }
  int MemsetAsync(void* dst, int value, int64_t bytes, GpuStream stream) override {
    return static_cast<int>(cudaMemsetAsync(dst, value, static_cast<size_t>(bytes), S(stream)));
  }
  int EventCreate(GpuEvent* event) override {
    cudaEvent_t e = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    *event = e;
    return static_cast<int>(err);
  }
  int EventRecord(GpuEvent event, GpuStream stream) override {
    return static_cast<int>(cudaEventRecord(static_cast<cudaEvent_t>(event), S(stream)));
  }
  EventState EventQuery(GpuEvent event, int* error) override {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    *error = static_cast<int>(e);
    if (e == cudaSuccess) return EventState::kDone;
    if (e == cudaErrorNotReady) return EventState::kPending;
    return EventState::kError;
  }
  int StreamWaitEvent(GpuStream stream, GpuEvent event) override {
    return static_cast<int>(cudaStreamWaitEvent(S(stream), static_cast<cudaEvent_t>(event), 0));
  }
  int EventDestroy(GpuEvent event) override {
    return static_cast<int>(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
  }
  std::string CudaErrorString(int error) override {
    return cudaGetErrorString(static_cast<cudaError_t>(error));
  }
  int GetDeviceCount(int* count) override { return static_cast<int>(cudaGetDeviceCount(count)); }
  int StreamCreate(GpuStream* stream) override {
    cudaStream_t s = nullptr;
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    *stream = s;
    return static_cast<int>(err);
  }
  int StreamDestroy(GpuStream stream) override {
    return static_cast<int>(cudaStreamDestroy(S(stream)));
  }
  int StreamSynchronize(GpuStream stream) override {
    return static_cast<int>(cudaStreamSynchronize(S(stream)));
  }
  int MallocHost(void** ptr, int64_t bytes) override {
    return static_cast<int>(cudaMallocHost(ptr, static_cast<size_t>(bytes)));
  }
  int FreeHost(void* ptr) override { return static_cast<int>(cudaFreeHost(ptr)); }
  int Scale(void* dst, const void* src, int64_t count, DataType dtype, double factor,
            GpuStream stream) override {
    return cuda::LaunchScale(dst, src, count, dtype, factor, stream);
  }
  int CopyBatch(void* const* dst, const void* const* src, const int64_t* bytes, int n,
                GpuStream stream) override {
    for (int i = 0; i < n; i += cuda::kMaxCopyBatch) {
      const int k = std::min(cuda::kMaxCopyBatch, n - i);
      if (int err = cuda::LaunchCopyBatch(dst + i, src + i, bytes + i, k, stream)) return err;
    }
    return 0;
  }
  int Divide(void* buf, int64_t count, DataType dtype, int64_t divisor,
             GpuStream stream) override {
    return cuda::LaunchDivide(buf, count, dtype, divisor, stream);
  }
};

}  // namespace

std::unique_ptr<NcclApi> CreateCudaNcclApi() { return std::make_unique<CudaNcclApi>(); }

}  // namespace tfring

#endif  // GPU build
