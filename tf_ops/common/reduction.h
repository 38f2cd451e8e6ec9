// Element-wise arithmetic on raw buffers of any supported dtype: combining
// two buffers with a reduce op, and scaling a buffer. Data planes that reduce
// by themselves (and the MPI user ops for float16/bfloat16) call these.
#ifndef TFRING_COMMON_REDUCTION_H
#define TFRING_COMMON_REDUCTION_H

#include <cstdint>

#include "common.h"
#include "status.h"

namespace tfring {

// dst[i] = op(dst[i], src[i]). op is one of SUM, MIN, MAX, PRODUCT; bool
// treats SUM/MAX as "or" and MIN/PRODUCT as "and".
Status ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op);
// dst[i] = op(a[i], b[i]): a reduction out of place, with no copy of `a`
// into `dst` first. `dst` may be `a` (then it is ReduceInto(dst, b)).
Status ReduceTo(void* dst, const void* a, const void* b, int64_t count, DataType dtype,
                ReduceOp op);

// buf[i] *= factor. Integers are scaled in double precision and truncated.
Status ScaleBuffer(void* buf, int64_t count, DataType dtype, double factor);

// Finishes an AVERAGE/SUM reduction: applies `postscale` and, for AVERAGE,
// divides by `ranks`. Integers are divided (truncating, like C) rather than
// multiplied by a rounded reciprocal, so e.g. 6/3 is exactly 2.
Status FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op, double postscale,
                       int ranks);

// IEEE half and bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace tfring

#endif  // TFRING_COMMON_REDUCTION_H
