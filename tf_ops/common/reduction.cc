#include "reduction.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tfring {

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (absx < 0x38800000u) {  // subnormal or zero in half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    // value = m * 2^(e-150) and a half subnormal is hm * 2^-24.
    uint32_t shift = 126 - e;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    uint32_t half_m = m >> shift;
    if (rem > halfway || (rem == halfway && (half_m & 1))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t h = ((absx - 0x38000000u) >> 13);
  uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

namespace {

// dst[i] = op(a[i], b[i]); dst is either a itself or disjoint from it.
template <typename T>
void ReduceTyped(T* dst, const T* a, const T* src, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(a[i] + src[i]);
      break;
    case ReduceOp::MIN:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::min(a[i], src[i]);
      break;
    case ReduceOp::MAX:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::max(a[i], src[i]);
      break;
    case ReduceOp::PRODUCT:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(a[i] * src[i]);
      break;
    default:
      break;
  }
}

void ReduceBool(uint8_t* dst, const uint8_t* a, const uint8_t* src, int64_t n, ReduceOp op) {
  const bool any = (op == ReduceOp::SUM || op == ReduceOp::MAX);
  for (int64_t i = 0; i < n; ++i) dst[i] = any ? (a[i] || src[i]) : (a[i] && src[i]);
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Reduce16(uint16_t* dst, const uint16_t* x, const uint16_t* src, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) {
    float a = ToF(x[i]), b = ToF(src[i]), r = a;
    switch (op) {
      case ReduceOp::SUM: r = a + b; break;
      case ReduceOp::MIN: r = std::min(a, b); break;
      case ReduceOp::MAX: r = std::max(a, b); break;
      case ReduceOp::PRODUCT: r = a * b; break;
      default: break;
    }
    dst[i] = FromF(r);
  }
}

// Horovod's scaling rule, which every binding keeps: the factor is applied
// in float64 for integers (then truncated), in the tensor's own type for
// float32 and float64 (the factor rounded to it first, as `x * f` with a
// Python float does in torch and TF), and in float32 for the 16-bit floats.
template <typename T>
struct ScaleMath {
  using type = double;
};
template <>
struct ScaleMath<float> {
  using type = float;
};

template <typename T>
void ScaleTyped(T* buf, int64_t n, double factor) {
  using M = typename ScaleMath<T>::type;
  const M f = static_cast<M>(factor);
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<T>(static_cast<M>(buf[i]) * f);
}

// float16 and bfloat16: in float (a float factor), rounded once to 16 bits.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Scale16(uint16_t* buf, int64_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) buf[i] = FromF(ToF(buf[i]) * f);
}

}  // namespace

Status ReduceInto(void* dst, const void* src, int64_t n, DataType dtype, ReduceOp op) {
  return ReduceTo(dst, dst, src, n, dtype, op);
}

Status ReduceTo(void* dst, const void* a, const void* b, int64_t n, DataType dtype, ReduceOp op) {
  if (op != ReduceOp::SUM && op != ReduceOp::MIN && op != ReduceOp::MAX &&
      op != ReduceOp::PRODUCT) {
    return Status::InvalidArgument(std::string("tfring: reduce op ") + ReduceOpName(op) +
                                   " cannot be applied element-wise");
  }
#define TFRING_REDUCE_TO(T) \
  ReduceTyped(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n, op)
  switch (dtype) {
    case DataType::UINT8: TFRING_REDUCE_TO(uint8_t); break;
    case DataType::INT8: TFRING_REDUCE_TO(int8_t); break;
    case DataType::UINT16: TFRING_REDUCE_TO(uint16_t); break;
    case DataType::INT16: TFRING_REDUCE_TO(int16_t); break;
    case DataType::INT32: TFRING_REDUCE_TO(int32_t); break;
    case DataType::INT64: TFRING_REDUCE_TO(int64_t); break;
    case DataType::FLOAT32: TFRING_REDUCE_TO(float); break;
    case DataType::FLOAT64: TFRING_REDUCE_TO(double); break;
    case DataType::BOOL:
      ReduceBool(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                 static_cast<const uint8_t*>(b), n, op);
      break;
    case DataType::FLOAT16:
      Reduce16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                         static_cast<const uint16_t*>(b), n, op);
      break;
    case DataType::BFLOAT16:
      Reduce16<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(dst),
                                                 static_cast<const uint16_t*>(a),
                                                 static_cast<const uint16_t*>(b), n, op);
      break;
  }
#undef TFRING_REDUCE_TO
  return Status::OK();
}

Status ReduceInOrder(void* dst, const void* const* srcs, int n, int64_t count, DataType dtype,
                     ReduceOp op) {
  if (n < 1) return Status::InvalidArgument("tfring: a reduction needs at least one source");
  const int64_t esize = DataTypeSize(dtype);
  if (n == 1) {
    if (dst != srcs[0] && count > 0) std::memcpy(dst, srcs[0], count * esize);
    return Status::OK();
  }
  int aliased = -1;
  for (int j = 0; j < n; ++j) {
    if (srcs[j] == dst) aliased = j;
  }
  if (aliased < 2) {
    // dst[i] is written only after its own sources' element i was read, so
    // dst may be the first or the second source.
    TFRING_RETURN_IF_ERROR(ReduceTo(dst, srcs[0], srcs[1], count, dtype, op));
    for (int j = 2; j < n; ++j) TFRING_RETURN_IF_ERROR(ReduceInto(dst, srcs[j], count, dtype, op));
    return Status::OK();
  }
  // dst is a later source: it must be read before the sources ahead of it
  // are combined into it, so those go through a buffer that stays in L1.
  constexpr int64_t kTileBytes = 8192;
  alignas(64) char tile[kTileBytes];
  const int64_t per_tile = kTileBytes / esize;
  char* out = static_cast<char*>(dst);
  for (int64_t lo = 0; lo < count; lo += per_tile) {
    const int64_t m = std::min(per_tile, count - lo);
    const int64_t at = lo * esize;
    auto src = [&](int j) { return static_cast<const char*>(srcs[j]) + at; };
    TFRING_RETURN_IF_ERROR(ReduceTo(tile, src(0), src(1), m, dtype, op));
    for (int j = 2; j < aliased; ++j) TFRING_RETURN_IF_ERROR(ReduceInto(tile, src(j), m, dtype, op));
    TFRING_RETURN_IF_ERROR(ReduceTo(out + at, tile, out + at, m, dtype, op));
    for (int j = aliased + 1; j < n; ++j) {
      TFRING_RETURN_IF_ERROR(ReduceInto(out + at, src(j), m, dtype, op));
    }
  }
  return Status::OK();
}

Status ScaleBuffer(void* buf, int64_t n, DataType dtype, double factor) {
  if (factor == 1.0) return Status::OK();
  switch (dtype) {
    case DataType::UINT8: ScaleTyped(static_cast<uint8_t*>(buf), n, factor); break;
    case DataType::INT8: ScaleTyped(static_cast<int8_t*>(buf), n, factor); break;
    case DataType::UINT16: ScaleTyped(static_cast<uint16_t*>(buf), n, factor); break;
    case DataType::INT16: ScaleTyped(static_cast<int16_t*>(buf), n, factor); break;
    case DataType::INT32: ScaleTyped(static_cast<int32_t*>(buf), n, factor); break;
    case DataType::INT64: ScaleTyped(static_cast<int64_t*>(buf), n, factor); break;
    case DataType::FLOAT32: ScaleTyped(static_cast<float*>(buf), n, factor); break;
    case DataType::FLOAT64: ScaleTyped(static_cast<double*>(buf), n, factor); break;
    case DataType::FLOAT16: Scale16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(buf), n, factor); break;
    case DataType::BFLOAT16: Scale16<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(buf), n, factor); break;
    case DataType::BOOL:
      return Status::InvalidArgument("tfring: bool tensors cannot be scaled (use op=Sum, Min or Max)");
  }
  return Status::OK();
}

namespace {
// buf[i] / d in T's own arithmetic: C's truncating division for integers,
// and for floating point exactly TF's `x / size`.
template <typename T>
void DivideTyped(T* buf, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<T>(buf[i] / static_cast<T>(d));
}

// TF divides float16 and bfloat16 in float and rounds the quotient.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Divide16(uint16_t* buf, int64_t n, int64_t d) {
  const float f = static_cast<float>(d);
  for (int64_t i = 0; i < n; ++i) buf[i] = FromF(ToF(buf[i]) / f);
}
}  // namespace

Status FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op, double postscale,
                       int ranks) {
  if (op != ReduceOp::AVERAGE) return ScaleBuffer(buf, count, dtype, postscale);
  // With a postscale, one rounding of x * postscale / ranks (in double).
  if (IsFloatingPoint(dtype) && postscale != 1.0) {
    return ScaleBuffer(buf, count, dtype, postscale / ranks);
  }
  // Otherwise an average divides rather than multiplying by a rounded
  // reciprocal: 6/3 is exactly 2 for integers, and floating-point results
  // are TF's `sum / size` bit for bit (x * (1/3) is not, even in double).
  TFRING_RETURN_IF_ERROR(ScaleBuffer(buf, count, dtype, postscale));
  switch (dtype) {
    case DataType::UINT8: DivideTyped(static_cast<uint8_t*>(buf), count, ranks); break;
    case DataType::INT8: DivideTyped(static_cast<int8_t*>(buf), count, ranks); break;
    case DataType::UINT16: DivideTyped(static_cast<uint16_t*>(buf), count, ranks); break;
    case DataType::INT16: DivideTyped(static_cast<int16_t*>(buf), count, ranks); break;
    case DataType::INT32: DivideTyped(static_cast<int32_t*>(buf), count, ranks); break;
    case DataType::INT64: DivideTyped(static_cast<int64_t*>(buf), count, ranks); break;
    case DataType::FLOAT32: DivideTyped(static_cast<float*>(buf), count, ranks); break;
    case DataType::FLOAT64: DivideTyped(static_cast<double*>(buf), count, ranks); break;
    case DataType::FLOAT16:
      Divide16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(buf), count, ranks);
      break;
    case DataType::BFLOAT16:
      Divide16<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(buf), count, ranks);
      break;
    case DataType::BOOL:
      return Status::InvalidArgument("tfring: bool tensors cannot be averaged (use op=Sum, Min or Max)");
  }
  return Status::OK();
}

}  // namespace tfring
