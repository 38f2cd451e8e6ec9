// Vocabulary shared by every layer of the core: data types, reduce ops,
// collective kinds and tensor shapes. No framework headers here.
#ifndef TFRING_COMMON_COMMON_H
#define TFRING_COMMON_COMMON_H

#include <cstdint>
#include <string>
#include <vector>

namespace tfring {

// Values are part of the wire format between ranks: append, never renumber.
enum class DataType : int32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  INT32 = 4,
  INT64 = 5,
  FLOAT16 = 6,
  BFLOAT16 = 7,
  FLOAT32 = 8,
  FLOAT64 = 9,
  BOOL = 10,
};

// Same numbering as Horovod's ReduceOp, so the reduce_op attribute of graphs
// built with Horovod means the same thing here.
enum class ReduceOp : int32_t {
  AVERAGE = 0,
  SUM = 1,
  ADASUM = 2,
  MIN = 3,
  MAX = 4,
  PRODUCT = 5,
};

enum class CollectiveType : int32_t {
  ALLREDUCE = 0,
  ALLGATHER = 1,
  BROADCAST = 2,
  ALLTOALL = 3,
  REDUCESCATTER = 4,
  JOIN = 5,
  BARRIER = 6,
  // Process-set membership changes are negotiated like tensors so that every
  // rank applies them at the same point of the same cycle.
  ADD_PROCESS_SET = 7,
  REMOVE_PROCESS_SET = 8,
};

using TensorShape = std::vector<int64_t>;

// Where a tensor's memory lives, numbered as Horovod numbers it so that the
// framework layer can pass its device id through unchanged: host memory is
// kCpuDevice, a GPU is its ordinal (0, 1, ...). Part of the wire format.
constexpr int32_t kCpuDevice = -1;
inline bool IsGpuDevice(int32_t device) { return device >= 0; }
// "CPU" or "GPU:<ordinal>", as messages show it.
std::string DeviceName(int32_t device);

int64_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
bool IsFloatingPoint(DataType dtype);
const char* ReduceOpName(ReduceOp op);
const char* CollectiveName(CollectiveType type);
int64_t NumElements(const TensorShape& shape);
std::string ShapeString(const TensorShape& shape);
// The rows of a `rows`-row tensor that a reducescatter leaves on set rank
// `rank` of `size`: equal blocks, the first rows % size ranks one row more.
int64_t ScatterRows(int64_t rows, int size, int rank);

}  // namespace tfring

#endif  // TFRING_COMMON_COMMON_H
