// Element-wise kernels the NCCL plane runs on the op's stream: scaling
// (prescale, postscale, the 1/size of Average) and the integer division of
// Average. Declared without CUDA types so that host code needs no CUDA
// headers; `stream` is a cudaStream_t and the result a cudaError_t.
#ifndef TFRING_COMMON_OPS_CUDA_GPU_KERNELS_H
#define TFRING_COMMON_OPS_CUDA_GPU_KERNELS_H

#include <cstdint>

#include "../../common.h"

namespace tfring {
namespace cuda {

// dst[i] = src[i] * factor (dst may be src), with ScaleBuffer's semantics
// (reduction.h): float16/bfloat16 are scaled in float and rounded to nearest
// even, integers are scaled in double and truncated. bool is refused
// (cudaErrorInvalidValue).
int LaunchScale(void* dst, const void* src, int64_t count, DataType dtype, double factor,
                void* stream);
// buf[i] /= divisor for integer dtypes (C's truncating division).
int LaunchDivide(void* buf, int64_t count, DataType dtype, int64_t divisor, void* stream);

}  // namespace cuda
}  // namespace tfring

#endif  // TFRING_COMMON_OPS_CUDA_GPU_KERNELS_H
