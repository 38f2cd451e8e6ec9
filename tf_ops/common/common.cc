#include "common.h"

#include <sstream>

namespace tfring {

int64_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::UINT8:
    case DataType::INT8:
    case DataType::BOOL:
      return 1;
    case DataType::UINT16:
    case DataType::INT16:
    case DataType::FLOAT16:
    case DataType::BFLOAT16:
      return 2;
    case DataType::INT32:
    case DataType::FLOAT32:
      return 4;
    case DataType::INT64:
    case DataType::FLOAT64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::UINT8: return "uint8";
    case DataType::INT8: return "int8";
    case DataType::UINT16: return "uint16";
    case DataType::INT16: return "int16";
    case DataType::INT32: return "int32";
    case DataType::INT64: return "int64";
    case DataType::FLOAT16: return "float16";
    case DataType::BFLOAT16: return "bfloat16";
    case DataType::FLOAT32: return "float32";
    case DataType::FLOAT64: return "float64";
    case DataType::BOOL: return "bool";
  }
  return "unknown";
}

bool IsFloatingPoint(DataType dtype) {
  return dtype == DataType::FLOAT16 || dtype == DataType::BFLOAT16 ||
         dtype == DataType::FLOAT32 || dtype == DataType::FLOAT64;
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::AVERAGE: return "Average";
    case ReduceOp::SUM: return "Sum";
    case ReduceOp::ADASUM: return "Adasum";
    case ReduceOp::MIN: return "Min";
    case ReduceOp::MAX: return "Max";
    case ReduceOp::PRODUCT: return "Product";
  }
  return "unknown";
}

const char* CollectiveName(CollectiveType type) {
  switch (type) {
    case CollectiveType::ALLREDUCE: return "ALLREDUCE";
    case CollectiveType::ALLGATHER: return "ALLGATHER";
    case CollectiveType::BROADCAST: return "BROADCAST";
    case CollectiveType::ALLTOALL: return "ALLTOALL";
    case CollectiveType::REDUCESCATTER: return "REDUCESCATTER";
    case CollectiveType::JOIN: return "JOIN";
    case CollectiveType::BARRIER: return "BARRIER";
    case CollectiveType::ADD_PROCESS_SET: return "ADD_PROCESS_SET";
    case CollectiveType::REMOVE_PROCESS_SET: return "REMOVE_PROCESS_SET";
  }
  return "UNKNOWN";
}

std::string DeviceName(int32_t device) {
  return IsGpuDevice(device) ? "GPU:" + std::to_string(device) : std::string("CPU");
}

int64_t NumElements(const TensorShape& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

int64_t ScatterRows(int64_t rows, int size, int rank) {
  return rows / size + (rank < rows % size ? 1 : 0);
}

std::string ShapeString(const TensorShape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) os << ", ";
    os << shape[i];
  }
  os << "]";
  return os.str();
}

}  // namespace tfring
