// The NCCL and CUDA calls the NCCL data plane makes, behind one small
// interface. The plane's logic (communicator keying, unique-id exchange,
// error mapping, fusion layout, the order of calls) is written against this
// interface only, so it compiles and is unit-tested without nccl.h or a CUDA
// toolkit, with a fake. The real implementation (ops/cuda/cuda_nccl_api.cc)
// is compiled only when tfring is built for GPUs.
//
// Handles are opaque pointers: ncclComm_t, cudaStream_t and cudaEvent_t are
// all pointers in the real headers.
#ifndef TFRING_COMMON_OPS_NCCL_API_H
#define TFRING_COMMON_OPS_NCCL_API_H

#include <cstdint>
#include <cstdlib>
#include <string>

#include "../common.h"

namespace tfring {

using NcclComm = void*;
using GpuStream = void*;
using GpuEvent = void*;

// NCCL's documented result codes (ncclResult_t), same values. The real
// implementation static_asserts that they agree with nccl.h.
enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
  kTimeout = 8,
};
const char* NcclResultName(NcclResult r);

// NCCL_UNIQUE_ID_BYTES in nccl.h.
constexpr size_t kNcclUniqueIdBytes = 128;

// State of a recorded event.
enum class EventState { kDone, kPending, kError };

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // --- NCCL ---------------------------------------------------------------
  // Fills `id` with kNcclUniqueIdBytes bytes.
  virtual NcclResult GetUniqueId(std::string* id) = 0;
  // Non-blocking communicator (ncclConfig_t.blocking = 0): may return
  // kInProgress; the caller then polls CommGetAsyncError until it is done.
  virtual NcclResult CommInitRank(NcclComm* comm, int nranks, const std::string& id, int rank) = 0;
  virtual NcclResult CommGetAsyncError(NcclComm comm, NcclResult* async_error) = 0;
  virtual NcclResult CommAbort(NcclComm comm) = 0;
  virtual NcclResult CommDestroy(NcclComm comm) = 0;
  virtual std::string ErrorString(NcclResult r) = 0;  // ncclGetErrorString
  virtual std::string LastError(NcclComm comm) = 0;   // ncclGetLastError
  virtual NcclResult GroupStart() = 0;
  virtual NcclResult GroupEnd() = 0;
  // `op` is SUM, MIN, MAX or PRODUCT (averaging and scaling are done by the
  // plane with kernels). Counts are elements of `dtype`.
  virtual NcclResult AllReduce(const void* send, void* recv, int64_t count, DataType dtype,
                               ReduceOp op, NcclComm comm, GpuStream stream) = 0;
  virtual NcclResult Reduce(const void* send, void* recv, int64_t count, DataType dtype,
                            ReduceOp op, int root, NcclComm comm, GpuStream stream) = 0;
  virtual NcclResult ReduceScatter(const void* send, void* recv, int64_t recv_count,
                                   DataType dtype, ReduceOp op, NcclComm comm,
                                   GpuStream stream) = 0;
  // Byte-wise collectives move ncclUint8/ncclInt8.
  virtual NcclResult AllGather(const void* send, void* recv, int64_t bytes_per_rank, NcclComm comm,
                               GpuStream stream) = 0;
  virtual NcclResult Broadcast(const void* send, void* recv, int64_t bytes, int root,
                               NcclComm comm, GpuStream stream) = 0;
  virtual NcclResult Send(const void* buf, int64_t bytes, int peer, NcclComm comm,
                          GpuStream stream) = 0;
  virtual NcclResult Recv(void* buf, int64_t bytes, int peer, NcclComm comm, GpuStream stream) = 0;
  // Whether NCCL reduces this dtype (e.g. NCCL has no bool or 16-bit integers).
  virtual bool SupportsDataType(DataType dtype) const = 0;

  // --- CUDA (0 is cudaSuccess) --------------------------------------------
  virtual int GetDevice(int* device) = 0;
  virtual int SetDevice(int device) = 0;
  virtual int Malloc(void** ptr, int64_t bytes) = 0;
  virtual int Free(void* ptr) = 0;
  // Device-to-device (cudaMemcpyDefault) on `stream`.
  virtual int MemcpyAsync(void* dst, const void* src, int64_t bytes, GpuStream stream) = 0;
  virtual int MemsetAsync(void* dst, int value, int64_t bytes, GpuStream stream) = 0;
  virtual int EventCreate(GpuEvent* event) = 0;  // timing disabled
  virtual int EventRecord(GpuEvent event, GpuStream stream) = 0;
  virtual EventState EventQuery(GpuEvent event, int* error) = 0;
  // Work queued on `stream` after this call waits for `event`'s last record.
  virtual int StreamWaitEvent(GpuStream stream, GpuEvent event) = 0;
  virtual int EventDestroy(GpuEvent event) = 0;
  virtual std::string CudaErrorString(int error) = 0;
  // The rest has host-memory defaults, so that a fake on host memory (the
  // unit tests) needs none of it.
  virtual int GetDeviceCount(int* count) {
    *count = 1;
    return 0;
  }
  // A stream that does not synchronise with the legacy default stream.
  virtual int StreamCreate(GpuStream* stream) {
    *stream = nullptr;
    return 0;
  }
  virtual int StreamDestroy(GpuStream stream) {
    (void)stream;
    return 0;
  }
  virtual int StreamSynchronize(GpuStream stream) {
    (void)stream;
    return 0;
  }
  // Page-locked host memory (asynchronous copies to and from a GPU need it).
  virtual int MallocHost(void** ptr, int64_t bytes) {
    *ptr = std::malloc(static_cast<size_t>(bytes));
    return *ptr == nullptr && bytes > 0 ? 2 : 0;  // 2: cudaErrorMemoryAllocation
  }
  virtual int FreeHost(void* ptr) {
    std::free(ptr);
    return 0;
  }
  // dst[i] = src[i] * factor on `stream`, with ScaleBuffer's semantics
  // (reduction.h); dst may be src.
  virtual int Scale(void* dst, const void* src, int64_t count, DataType dtype, double factor,
                    GpuStream stream) = 0;
  // buf[i] /= divisor in the dtype's own arithmetic, like FinishReduction's
  // average (integers truncate).
  virtual int Divide(void* buf, int64_t count, DataType dtype, int64_t divisor,
                     GpuStream stream) = 0;
  // dst[i] <- src[i] (bytes[i] each, i < n) on `stream`, in as few launches
  // as the implementation can; by default one MemcpyAsync each.
  virtual int CopyBatch(void* const* dst, const void* const* src, const int64_t* bytes, int n,
                        GpuStream stream) {
    for (int i = 0; i < n; ++i) {
      if (int err = MemcpyAsync(dst[i], src[i], bytes[i], stream)) return err;
    }
    return 0;
  }
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_NCCL_API_H
