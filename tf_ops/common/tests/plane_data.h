// Test data for the data-plane tests (conformance_test.cc, shm_plane_test.cc):
// values every rank can compute for every other rank, so that a check needs
// no collective of the transport under test, and the serial reference.
#ifndef TFRING_COMMON_TESTS_PLANE_DATA_H
#define TFRING_COMMON_TESTS_PLANE_DATA_H

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../common.h"
#include "../reduction.h"

namespace tfring {
namespace test {

inline const DataType kAllTypes[] = {DataType::UINT8,   DataType::INT8,     DataType::UINT16,
                                     DataType::INT16,   DataType::INT32,    DataType::INT64,
                                     DataType::FLOAT16, DataType::BFLOAT16, DataType::FLOAT32,
                                     DataType::FLOAT64, DataType::BOOL};
inline const ReduceOp kAllOps[] = {ReduceOp::SUM, ReduceOp::MIN, ReduceOp::MAX,
                                   ReduceOp::PRODUCT};

inline bool IsFloat(DataType dt) {
  return dt == DataType::FLOAT16 || dt == DataType::BFLOAT16 || dt == DataType::FLOAT32 ||
         dt == DataType::FLOAT64;
}

// Small integers that differ by rank, element and salt: exact in every dtype
// and for every op over up to 4 ranks (a product of 4 values <= 3 fits int8),
// so any reduction order gives the serial result exactly.
inline int SmallValue(int rank, int64_t i, int salt) {
  return 1 + static_cast<int>((i * 7 + rank * 3 + salt) % 3);
}

template <typename T>
void FillAs(void* buf, int64_t n, int rank, int salt) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(SmallValue(rank, i, salt));
}

inline void Fill(void* buf, int64_t n, DataType dt, int rank, int salt) {
  switch (dt) {
    case DataType::UINT8: FillAs<uint8_t>(buf, n, rank, salt); break;
    case DataType::INT8: FillAs<int8_t>(buf, n, rank, salt); break;
    case DataType::UINT16: FillAs<uint16_t>(buf, n, rank, salt); break;
    case DataType::INT16: FillAs<int16_t>(buf, n, rank, salt); break;
    case DataType::INT32: FillAs<int32_t>(buf, n, rank, salt); break;
    case DataType::INT64: FillAs<int64_t>(buf, n, rank, salt); break;
    case DataType::FLOAT32: FillAs<float>(buf, n, rank, salt); break;
    case DataType::FLOAT64: FillAs<double>(buf, n, rank, salt); break;
    case DataType::FLOAT16:
    case DataType::BFLOAT16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      for (int64_t i = 0; i < n; ++i) {
        float v = static_cast<float>(SmallValue(rank, i, salt));
        p[i] = dt == DataType::FLOAT16 ? FloatToHalf(v) : FloatToBFloat16(v);
      }
      break;
    }
    case DataType::BOOL: {
      uint8_t* p = static_cast<uint8_t*>(buf);
      for (int64_t i = 0; i < n; ++i) p[i] = SmallValue(rank, i, salt) != 2;
      break;
    }
  }
}

// A buffer of `n` elements holding rank `rank`'s Fill() values (never empty,
// so data() is a valid pointer).
inline std::vector<char> Filled(int64_t n, DataType dt, int rank, int salt) {
  std::vector<char> buf(std::max<int64_t>(n * DataTypeSize(dt), 1));
  Fill(buf.data(), n, dt, rank, salt);
  return buf;
}

// Bytes of a deterministic pattern for (rank, salt), for the byte movers.
inline void FillBytes(char* p, int64_t n, int rank, int salt) {
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<char>((i * 131 + rank * 17 + salt * 7) & 0xff);
}

// What the reduction over `size` ranks of their Fill() values must give,
// computed serially.
inline std::vector<char> Expected(int64_t n, DataType dt, ReduceOp op, int size, int salt) {
  std::vector<char> acc = Filled(n, dt, 0, salt);
  for (int r = 1; r < size; ++r) {
    std::vector<char> other = Filled(n, dt, r, salt);
    ReduceInto(acc.data(), other.data(), n, dt, op);
  }
  return acc;
}

// The first byte where a and b differ, or -1.
inline int64_t FirstDifference(const char* a, const char* b, int64_t bytes) {
  for (int64_t i = 0; i < bytes; ++i)
    if (a[i] != b[i]) return i;
  return -1;
}

}  // namespace test
}  // namespace tfring

#endif  // TFRING_COMMON_TESTS_PLANE_DATA_H
