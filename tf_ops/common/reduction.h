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

// dst[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[n-1][i]):
// n >= 1 sources combined in the order given, so that wherever a reduction
// runs it gives the bits of the serial one in that order (rank order, for
// the planes). `dst` may be one of the sources (in place); otherwise it must
// not overlap any of them. Nothing is staged: with dst == srcs[k], k >= 2,
// the first k sources are combined a few KiB at a time in a local buffer.
Status ReduceInOrder(void* dst, const void* const* srcs, int n, int64_t count, DataType dtype,
                     ReduceOp op);

// buf[i] *= factor by Horovod's rule: in double for integers (truncated),
// in the dtype's own type for float32 and float64 (the factor rounded to it:
// torch's and TF's `x * f`), in float for float16 and bfloat16 (rounded once
// to 16 bits).
Status ScaleBuffer(void* buf, int64_t count, DataType dtype, double factor);

// Finishes an AVERAGE/SUM reduction: applies `postscale` and, for AVERAGE,
// divides by `ranks`. With no postscale an average is a division in the
// dtype's own arithmetic rather than a multiplication by a rounded
// reciprocal: integers truncate like C (6/3 is exactly 2), floating point
// gives TF's `sum / size` bit for bit. With one, floating point is scaled
// once by postscale / ranks (as Horovod folds the average into it).
Status FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op, double postscale,
                       int ranks);

// IEEE half and bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace tfring

#endif  // TFRING_COMMON_REDUCTION_H
