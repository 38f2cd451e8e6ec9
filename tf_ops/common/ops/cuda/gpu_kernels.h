// Element-wise kernels a GPU executor runs on its stream: scaling (prescale,
// postscale) and the division of Average, with the CPU's semantics
// (reduction.h), so that a GPU's results equal the CPU's bit for bit. Declared without CUDA types so that host code needs no CUDA
// headers; `stream` is a cudaStream_t and the result a cudaError_t.
#ifndef TFRING_COMMON_OPS_CUDA_GPU_KERNELS_H
#define TFRING_COMMON_OPS_CUDA_GPU_KERNELS_H

#include <cstdint>

#include "../../common.h"

namespace tfring {
namespace cuda {

// dst[i] = src[i] * factor (dst may be src), with ScaleBuffer's semantics
// (reduction.h): Horovod's rule, in double for integers (truncated), in the
// dtype's own type for float and double, in float for float16/bfloat16. bool is refused (cudaErrorInvalidValue).
int LaunchScale(void* dst, const void* src, int64_t count, DataType dtype, double factor,
                void* stream);
// buf[i] /= divisor in the dtype's own arithmetic (C's truncating division
// for integers; float16/bfloat16 in float, rounded). bool is refused.
int LaunchDivide(void* buf, int64_t count, DataType dtype, int64_t divisor, void* stream);

// The most copies one LaunchCopyBatch takes (its arguments travel as kernel
// parameters, which CUDA caps at 4 KB).
constexpr int kMaxCopyBatch = 64;
// dst[i] <- src[i], bytes[i] bytes each, for i < n <= kMaxCopyBatch, in one
// kernel: packing a fusion buffer with one cudaMemcpyAsync per tensor cost
// more host time than the GPU needs to copy a few MB.
int LaunchCopyBatch(void* const* dst, const void* const* src, const int64_t* bytes, int n,
                    void* stream);

}  // namespace cuda
}  // namespace tfring

#endif  // TFRING_COMMON_OPS_CUDA_GPU_KERNELS_H
