#include "mpi_context.h"

#include "../reduction.h"

namespace tfring {

namespace {

MPI_Datatype g_half_type = MPI_DATATYPE_NULL;
MPI_Datatype g_bf16_type = MPI_DATATYPE_NULL;
MPI_Op g_ops[2][4];  // [half|bf16][sum,min,max,prod]
bool g_types_ready = false;

int OpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return 0;
    case ReduceOp::MIN: return 1;
    case ReduceOp::MAX: return 2;
    case ReduceOp::PRODUCT: return 3;
    default: return -1;
  }
}

template <DataType D, ReduceOp O>
void UserReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(inout, in, *len, D, O);
}

template <DataType D>
void CreateOps(MPI_Op* ops) {
  MPI_Op_create(&UserReduce<D, ReduceOp::SUM>, 1, &ops[0]);
  MPI_Op_create(&UserReduce<D, ReduceOp::MIN>, 1, &ops[1]);
  MPI_Op_create(&UserReduce<D, ReduceOp::MAX>, 1, &ops[2]);
  MPI_Op_create(&UserReduce<D, ReduceOp::PRODUCT>, 1, &ops[3]);
}

}  // namespace

Status InitMPITypes() {
  if (g_types_ready) return Status::OK();
  MPI_Type_contiguous(2, MPI_BYTE, &g_half_type);
  MPI_Type_commit(&g_half_type);
  MPI_Type_contiguous(2, MPI_BYTE, &g_bf16_type);
  MPI_Type_commit(&g_bf16_type);
  CreateOps<DataType::FLOAT16>(g_ops[0]);
  CreateOps<DataType::BFLOAT16>(g_ops[1]);
  g_types_ready = true;
  return Status::OK();
}

void FreeMPITypes() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!g_types_ready || finalized) return;
  MPI_Type_free(&g_half_type);
  MPI_Type_free(&g_bf16_type);
  for (auto& row : g_ops)
    for (auto& op : row) MPI_Op_free(&op);
  g_types_ready = false;
}

MPI_Datatype MPIDataType(DataType dtype) {
  switch (dtype) {
    case DataType::UINT8: return MPI_UINT8_T;
    case DataType::INT8: return MPI_INT8_T;
    case DataType::UINT16: return MPI_UINT16_T;
    case DataType::INT16: return MPI_INT16_T;
    case DataType::INT32: return MPI_INT32_T;
    case DataType::INT64: return MPI_INT64_T;
    case DataType::FLOAT16: return g_half_type;
    case DataType::BFLOAT16: return g_bf16_type;
    case DataType::FLOAT32: return MPI_FLOAT;
    case DataType::FLOAT64: return MPI_DOUBLE;
    case DataType::BOOL: return MPI_C_BOOL;
  }
  return MPI_DATATYPE_NULL;
}

Status MPIReduceOp(DataType dtype, ReduceOp op, MPI_Op* out) {
  int idx = OpIndex(op);
  if (idx < 0) {
    return Status::InvalidArgument(std::string("tfring: the MPI data plane cannot run reduce op ") +
                                   ReduceOpName(op));
  }
  if (dtype == DataType::FLOAT16 || dtype == DataType::BFLOAT16) {
    *out = g_ops[dtype == DataType::FLOAT16 ? 0 : 1][idx];
  } else if (dtype == DataType::BOOL) {
    *out = (op == ReduceOp::SUM || op == ReduceOp::MAX) ? MPI_LOR : MPI_LAND;
  } else {
    static const MPI_Op ops[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
    *out = ops[idx];
  }
  return Status::OK();
}

}  // namespace tfring
