// Unit tests of reduction.cc's rounding: scaling and averaging must give what
// TF computes for the same values bit for bit (Horovod's own tests compare
// with threshold 0), and ReduceInOrder must combine its sources in the order
// given whatever source the output is. TF's arithmetic is modelled by plain
// IEEE operations: float32/float64 as themselves, float16 and bfloat16 in
// float with the result rounded (what Eigen's half and bfloat16 do).
// Every float16 and bfloat16 value is tried; float32 and float64 by sampling.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "../reduction.h"
#include "check.h"

using namespace tfring;

namespace {

bool Finite16(uint16_t bits, DataType dt) {
  const float f = dt == DataType::FLOAT16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
  return std::isfinite(f);
}

float To32(uint16_t bits, DataType dt) {
  return dt == DataType::FLOAT16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
}

uint16_t From32(float f, DataType dt) {
  return dt == DataType::FLOAT16 ? FloatToHalf(f) : FloatToBFloat16(f);
}

// Every finite 16-bit value, scaled by float32 factors and averaged over
// 2..7 ranks: TF's x * f and x / size computed in float, then rounded.
void Test16(DataType dt) {
  std::vector<uint16_t> all;
  for (uint32_t b = 0; b < 65536; ++b) {
    if (Finite16(static_cast<uint16_t>(b), dt)) all.push_back(static_cast<uint16_t>(b));
  }
  const int64_t n = static_cast<int64_t>(all.size());
  for (float f : {0.1f, 0.3f, 0.7384f, 1.5f, 3.14159f, 1e-3f}) {
    std::vector<uint16_t> got = all;
    CHECK(ScaleBuffer(got.data(), n, dt, f).ok());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += got[i] != From32(To32(all[i], dt) * f, dt);
    if (wrong) std::fprintf(stderr, "%s x %g: %lld wrong\n", DataTypeName(dt), f, (long long)wrong);
    CHECK(wrong == 0);
  }
  for (int ranks = 2; ranks <= 7; ++ranks) {
    std::vector<uint16_t> got = all;
    CHECK(FinishReduction(got.data(), n, dt, ReduceOp::AVERAGE, 1.0, ranks).ok());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      wrong += got[i] != From32(To32(all[i], dt) / static_cast<float>(ranks), dt);
    }
    if (wrong) std::fprintf(stderr, "%s / %d: %lld wrong\n", DataTypeName(dt), ranks, (long long)wrong);
    CHECK(wrong == 0);
  }
}

// Values of mixed magnitude and sign, all bits random.
template <typename T>
std::vector<T> Mixed(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> exp(-20, 20);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(std::ldexp(mant(gen), exp(gen)));
  return v;
}

// float32 and float64: x * f (f a float32, as TF's float attributes are)
// and x / size, in the type's own arithmetic.
template <typename T>
void TestWide(DataType dt) {
  const std::vector<T> all = Mixed<T>(200000, 7);
  const int64_t n = static_cast<int64_t>(all.size());
  for (float f : {0.1f, 0.7384f, 3.14159f}) {
    std::vector<T> got = all;
    CHECK(ScaleBuffer(got.data(), n, dt, f).ok());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += got[i] != static_cast<T>(all[i] * static_cast<T>(f));
    CHECK(wrong == 0);
  }
  for (int ranks = 2; ranks <= 7; ++ranks) {
    std::vector<T> got = all;
    CHECK(FinishReduction(got.data(), n, dt, ReduceOp::AVERAGE, 1.0, ranks).ok());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += got[i] != static_cast<T>(all[i] / static_cast<T>(ranks));
    if (wrong) std::fprintf(stderr, "%s / %d: %lld wrong\n", DataTypeName(dt), ranks, (long long)wrong);
    CHECK(wrong == 0);
  }
  // A factor that is no float32: Horovod's rule rounds it to T first and
  // multiplies in T (float32 * float32, not a rounded double product).
  std::vector<T> got = all;
  const double third = 1.0 / 3.0;
  CHECK(ScaleBuffer(got.data(), n, dt, third).ok());
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    wrong += got[i] != static_cast<T>(all[i] * static_cast<T>(third));
  }
  CHECK(wrong == 0);
  // Integers scale in double and truncate.
  int32_t ints[3] = {7, -7, 100};
  CHECK(ScaleBuffer(ints, 3, DataType::INT32, third).ok());
  CHECK(ints[0] == 2 && ints[1] == -2 && ints[2] == 33);
}

// An average with a postscale, and integers, keep their meaning.
void TestFinishOthers() {
  float f[2] = {3.0f, 6.0f};
  CHECK(FinishReduction(f, 2, DataType::FLOAT32, ReduceOp::AVERAGE, 2.0, 3).ok());
  CHECK(f[0] == 2.0f && f[1] == 4.0f);
  int32_t i[3] = {6, 7, -7};
  CHECK(FinishReduction(i, 3, DataType::INT32, ReduceOp::AVERAGE, 1.0, 3).ok());
  CHECK(i[0] == 2 && i[1] == 2 && i[2] == -2);
  float s[1] = {5.0f};
  CHECK(FinishReduction(s, 1, DataType::FLOAT32, ReduceOp::SUM, 0.5, 3).ok() && s[0] == 2.5f);
  uint8_t b[1] = {1};
  CHECK(!FinishReduction(b, 1, DataType::BOOL, ReduceOp::AVERAGE, 1.0, 2).ok());
}

// ReduceInOrder gives the serial left-to-right reduction of its sources,
// bit for bit, out of place and with the output as each of the sources, for
// counts that are and are not multiples of its internal tile.
template <typename T>
void TestInOrder(DataType dt) {
  for (int n : {2, 3, 4, 5}) {
    for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{2048}, int64_t{5000}}) {
      std::vector<std::vector<T>> src;
      for (int j = 0; j < n; ++j) src.push_back(Mixed<T>(count, 100 + j));
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX}) {
        std::vector<T> want = src[0];
        for (int j = 1; j < n; ++j) CHECK(ReduceInto(want.data(), src[j].data(), count, dt, op).ok());
        for (int out_as = -1; out_as < n; ++out_as) {
          std::vector<std::vector<T>> in = src;
          std::vector<T> out(count, static_cast<T>(-7));
          std::vector<const void*> ptrs;
          for (auto& v : in) ptrs.push_back(v.data());
          T* dst = out_as < 0 ? out.data() : in[out_as].data();
          CHECK(ReduceInOrder(dst, ptrs.data(), n, count, dt, op).ok());
          CHECK(std::memcmp(dst, want.data(), count * sizeof(T)) == 0);
          for (int j = 0; j < n; ++j) {  // only the output changes
            if (j != out_as) CHECK(in[j] == src[j]);
          }
        }
      }
      // Sums of mixed magnitudes depend on the order: the check can fail.
      std::vector<T> fwd = src[0], back = src[n - 1];
      for (int j = 1; j < n; ++j) ReduceInto(fwd.data(), src[j].data(), count, dt, ReduceOp::SUM);
      for (int j = n - 2; j >= 0; --j) ReduceInto(back.data(), src[j].data(), count, dt, ReduceOp::SUM);
      if (n >= 3 && count >= 1000) CHECK(fwd != back);
    }
  }
  const void* none[1] = {nullptr};
  CHECK(!ReduceInOrder(nullptr, none, 0, 0, dt, ReduceOp::SUM).ok());
}

}  // namespace

int main() {
  Test16(DataType::FLOAT16);
  Test16(DataType::BFLOAT16);
  TestWide<float>(DataType::FLOAT32);
  TestWide<double>(DataType::FLOAT64);
  TestFinishOthers();
  TestInOrder<float>(DataType::FLOAT32);
  TestInOrder<double>(DataType::FLOAT64);
  return CheckExitCode();
}
