#include "gpu_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tfring {
namespace cuda {
namespace {

// Enough blocks to fill any current GPU; each thread strides over the rest.
constexpr int kThreads = 256;
int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 4096 ? (b < 1 ? 1 : b) : 4096);
}

// Blocks per copy of a batch: one per 64 KB of the largest, up to 64.
unsigned CopyBlocks(int64_t largest) {
  const int64_t b = (largest + 65535) / 65536;
  return static_cast<unsigned>(b < 64 ? (b < 1 ? 1 : b) : 64);
}

// The CPU's ScaleBuffer (reduction.cc) bit for bit: Horovod's rule, in
// double for integers (truncating), in T's own type for float and double.
template <typename T, typename M>
__global__ void ScaleKernel(T* dst, const T* src, int64_t n, double factor) {
  const M f = static_cast<M>(factor);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    dst[i] = static_cast<T>(static_cast<M>(src[i]) * f);
  }
}

// 16-bit floats in float with a float factor, as on the CPU.
__global__ void ScaleHalfKernel(__half* dst, const __half* src, int64_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    dst[i] = __float2half_rn(__half2float(src[i]) * f);
  }
}

__global__ void ScaleBf16Kernel(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t n,
                                double factor) {
  const float f = static_cast<float>(factor);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    dst[i] = __float2bfloat16_rn(__bfloat162float(src[i]) * f);
  }
}

__global__ void DivideHalfKernel(__half* buf, int64_t n, float divisor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    buf[i] = __float2half_rn(__half2float(buf[i]) / divisor);
  }
}

__global__ void DivideBf16Kernel(__nv_bfloat16* buf, int64_t n, float divisor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    buf[i] = __float2bfloat16_rn(__bfloat162float(buf[i]) / divisor);
  }
}

template <typename T>
__global__ void DivideKernel(T* buf, int64_t n, T divisor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    buf[i] = static_cast<T>(buf[i] / divisor);
  }
}

struct CopyBatch {
  void* dst[kMaxCopyBatch];
  const void* src[kMaxCopyBatch];
  long long bytes[kMaxCopyBatch];
};

// Copy blockIdx.y of the batch, its blocks striding over it: 16 bytes at a
// time where both ends are 16-byte aligned, then the tail byte by byte.
__global__ void CopyBatchKernel(CopyBatch batch) {
  char* dst = static_cast<char*>(batch.dst[blockIdx.y]);
  const char* src = static_cast<const char*>(batch.src[blockIdx.y]);
  const long long bytes = batch.bytes[blockIdx.y];
  const long long start = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  const long long step = static_cast<long long>(blockDim.x) * gridDim.x;
  long long done = 0;
  if (((reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src)) &
       15) == 0) {
    const long long vectors = bytes / 16;
    for (long long i = start; i < vectors; i += step)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    done = vectors * 16;
  }
  for (long long i = done + start; i < bytes; i += step) dst[i] = src[i];
}

template <typename T, typename M = double>
int ScaleAny(void* dst, const void* src, int64_t n, double factor, cudaStream_t s) {
  ScaleKernel<T, M><<<Blocks(n), kThreads, 0, s>>>(static_cast<T*>(dst),
                                                      static_cast<const T*>(src), n, factor);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int Divide(void* buf, int64_t n, int64_t d, cudaStream_t s) {
  DivideKernel<T><<<Blocks(n), kThreads, 0, s>>>(static_cast<T*>(buf), n, static_cast<T>(d));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchScale(void* dst, const void* src, int64_t n, DataType dtype, double factor,
                void* stream) {
  if (n <= 0) return cudaSuccess;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int blocks = Blocks(n);
  switch (dtype) {
    case DataType::FLOAT32: return ScaleAny<float, float>(dst, src, n, factor, s);
    case DataType::FLOAT64: return ScaleAny<double>(dst, src, n, factor, s);
    case DataType::FLOAT16:
      ScaleHalfKernel<<<blocks, kThreads, 0, s>>>(static_cast<__half*>(dst),
                                                  static_cast<const __half*>(src), n, factor);
      return static_cast<int>(cudaGetLastError());
    case DataType::BFLOAT16:
      ScaleBf16Kernel<<<blocks, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst),
                                                  static_cast<const __nv_bfloat16*>(src), n,
                                                  factor);
      return static_cast<int>(cudaGetLastError());
    case DataType::INT32: return ScaleAny<int32_t>(dst, src, n, factor, s);
    case DataType::INT64: return ScaleAny<int64_t>(dst, src, n, factor, s);
    case DataType::UINT8: return ScaleAny<uint8_t>(dst, src, n, factor, s);
    case DataType::INT8: return ScaleAny<int8_t>(dst, src, n, factor, s);
    case DataType::UINT16: return ScaleAny<uint16_t>(dst, src, n, factor, s);
    case DataType::INT16: return ScaleAny<int16_t>(dst, src, n, factor, s);
    case DataType::BOOL: break;
  }
  return cudaErrorInvalidValue;
}

int LaunchCopyBatch(void* const* dst, const void* const* src, const int64_t* bytes, int n,
                    void* stream) {
  if (n <= 0) return cudaSuccess;
  if (n > kMaxCopyBatch) return cudaErrorInvalidValue;
  CopyBatch batch;
  int64_t largest = 0;
  for (int i = 0; i < n; ++i) {
    batch.dst[i] = dst[i];
    batch.src[i] = src[i];
    batch.bytes[i] = bytes[i];
    largest = bytes[i] > largest ? bytes[i] : largest;
  }
  CopyBatchKernel<<<dim3(CopyBlocks(largest), n), kThreads, 0,
                    static_cast<cudaStream_t>(stream)>>>(batch);
  return static_cast<int>(cudaGetLastError());
}

int LaunchDivide(void* buf, int64_t n, DataType dtype, int64_t d, void* stream) {
  if (n <= 0) return cudaSuccess;
  if (d == 0) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DataType::INT32: return Divide<int32_t>(buf, n, d, s);
    case DataType::INT64: return Divide<int64_t>(buf, n, d, s);
    case DataType::UINT8: return Divide<uint8_t>(buf, n, d, s);
    case DataType::INT8: return Divide<int8_t>(buf, n, d, s);
    case DataType::UINT16: return Divide<uint16_t>(buf, n, d, s);
    case DataType::INT16: return Divide<int16_t>(buf, n, d, s);
    case DataType::FLOAT32: return Divide<float>(buf, n, d, s);
    case DataType::FLOAT64: return Divide<double>(buf, n, d, s);
    case DataType::FLOAT16:
      DivideHalfKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<__half*>(buf), n,
                                                      static_cast<float>(d));
      return static_cast<int>(cudaGetLastError());
    case DataType::BFLOAT16:
      DivideBf16Kernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(buf), n,
                                                      static_cast<float>(d));
      return static_cast<int>(cudaGetLastError());
    default: break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace tfring
