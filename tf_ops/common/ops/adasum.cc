#include "adasum.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "../reduction.h"

namespace tfring {
namespace {

// float16 is combined in float and rounded back; the sums are in double.
template <typename T>
double Load(const T* p, int64_t i) {
  return static_cast<double>(p[i]);
}
template <>
double Load<uint16_t>(const uint16_t* p, int64_t i) {
  return HalfToFloat(p[i]);
}
template <typename T>
void Store(T* p, int64_t i, double v) {
  p[i] = static_cast<T>(v);
}
template <>
void Store<uint16_t>(uint16_t* p, int64_t i, double v) {
  p[i] = FloatToHalf(static_cast<float>(v));
}

// Elements [lo, lo + len) of the buffer.
struct Range {
  int64_t lo;
  int64_t len;
};

// The two halves of `r`; the first is the lower rank's at each level.
Range FirstHalf(const Range& r) { return {r.lo, r.len / 2}; }
Range SecondHalf(const Range& r) { return {r.lo + r.len / 2, r.len - r.len / 2}; }

// The coefficient of a vector with squared norm `nn` in the pair's sum. A
// zero vector adds nothing whatever its coefficient; 1 avoids 0/0.
double Coefficient(double dot, double nn) { return nn > 0 ? 1.0 - dot / (2.0 * nn) : 1.0; }

template <typename T>
Status Run(PointToPoint* p2p, T* buf, const std::vector<int64_t>& counts,
           MappedBuffer* scratch) {
  const int n = p2p->size(), me = p2p->rank();
  const size_t tensors = counts.size();
  std::vector<int64_t> start(tensors + 1, 0);
  for (size_t i = 0; i < tensors; ++i) start[i + 1] = start[i] + counts[i];
  Range cur{0, start[tensors]};
  scratch->Reserve(static_cast<size_t>(cur.len / 2 + 1) * sizeof(T));
  T* other = reinterpret_cast<T*>(scratch->data());
  // Per tensor: a.b, |a|^2, |b|^2, where a is the lower half-cube's vector.
  std::vector<double> sums(3 * tensors), peer_sums(3 * tensors);
  const int64_t sum_bytes = static_cast<int64_t>(sums.size() * sizeof(double));
  std::vector<Range> levels;

  // Reduce-scatter: at distance d the ranks r and r ^ d hold the same slice
  // of two vectors (those of their half-cubes); each keeps half of it.
  for (int d = 1; d < n; d <<= 1) {
    const int peer = me ^ d;
    const bool lower = (me & d) == 0;
    const Range keep = lower ? FirstHalf(cur) : SecondHalf(cur);
    const Range give = lower ? SecondHalf(cur) : FirstHalf(cur);
    TFRING_RETURN_IF_ERROR(p2p->SendRecv(buf + give.lo, give.len * sizeof(T), other,
                                         keep.len * sizeof(T), peer));
    std::fill(sums.begin(), sums.end(), 0.0);
    const size_t first_tensor =
        std::upper_bound(start.begin(), start.end(), keep.lo) - start.begin() - 1;
    for (size_t t = first_tensor; t < tensors && start[t] < keep.lo + keep.len; ++t) {
      const int64_t b = std::max(start[t], keep.lo);
      const int64_t e = std::min(start[t + 1], keep.lo + keep.len);
      double dot = 0, mine_nn = 0, other_nn = 0;
      for (int64_t j = b; j < e; ++j) {
        const double x = Load(buf, j), y = Load(other, j - keep.lo);
        dot += x * y;
        mine_nn += x * x;
        other_nn += y * y;
      }
      sums[3 * t] = dot;
      sums[3 * t + 1] = lower ? mine_nn : other_nn;
      sums[3 * t + 2] = lower ? other_nn : mine_nn;
    }
    // The 2d ranks of this cube hold the two vectors between them, one slice
    // each: add their partial sums by recursive doubling. Both sides of each
    // exchange add the same two numbers, so every rank gets the same bits.
    for (int j = 1; j <= d; j <<= 1) {
      TFRING_RETURN_IF_ERROR(
          p2p->SendRecv(sums.data(), sum_bytes, peer_sums.data(), sum_bytes, me ^ j));
      for (size_t k = 0; k < sums.size(); ++k) sums[k] += peer_sums[k];
    }
    for (size_t t = first_tensor; t < tensors && start[t] < keep.lo + keep.len; ++t) {
      const int64_t b = std::max(start[t], keep.lo);
      const int64_t e = std::min(start[t + 1], keep.lo + keep.len);
      const double ca = Coefficient(sums[3 * t], sums[3 * t + 1]);
      const double cb = Coefficient(sums[3 * t], sums[3 * t + 2]);
      const double c_mine = lower ? ca : cb, c_other = lower ? cb : ca;
      for (int64_t j = b; j < e; ++j) {
        Store(buf, j, c_mine * Load(buf, j) + c_other * Load(other, j - keep.lo));
      }
    }
    levels.push_back(cur);
    cur = keep;
  }
  // Allgather: undo the halving, nearest partner last.
  for (int d = n / 2; d >= 1; d >>= 1) {
    const Range parent = levels.back();
    levels.pop_back();
    const bool lower = (me & d) == 0;
    const Range theirs = lower ? SecondHalf(parent) : FirstHalf(parent);
    TFRING_RETURN_IF_ERROR(p2p->SendRecv(buf + cur.lo, cur.len * sizeof(T), buf + theirs.lo,
                                         theirs.len * sizeof(T), me ^ d));
    cur = parent;
  }
  return Status::OK();
}

}  // namespace

bool AdasumSupports(DataType dtype) {
  return dtype == DataType::FLOAT16 || dtype == DataType::FLOAT32 || dtype == DataType::FLOAT64;
}

Status AdasumAllreduce(PointToPoint* p2p, void* buffer, const std::vector<int64_t>& counts,
                       DataType dtype, MappedBuffer* scratch) {
  const int n = p2p->size();
  if (n <= 0 || (n & (n - 1)) != 0) {
    return Status::InvalidArgument("tfring: Adasum needs a power-of-two number of ranks, but the "
                                   "process set has " + std::to_string(n));
  }
  switch (dtype) {
    case DataType::FLOAT16:
      return Run(p2p, static_cast<uint16_t*>(buffer), counts, scratch);
    case DataType::FLOAT32:
      return Run(p2p, static_cast<float*>(buffer), counts, scratch);
    case DataType::FLOAT64:
      return Run(p2p, static_cast<double*>(buffer), counts, scratch);
    default:
      return Status::InvalidArgument(std::string("tfring: Adasum supports float16, float32 and "
                                                 "float64 tensors, not ") + DataTypeName(dtype));
  }
}

}  // namespace tfring
