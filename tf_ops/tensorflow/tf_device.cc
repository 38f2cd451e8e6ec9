#include "tf_device.h"

#include "../common/gpu_support.h"

#ifdef TFRING_WITH_NCCL
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/types.h"
#include "xla/stream_executor/stream.h"
#include "xla/stream_executor/stream_executor.h"
#endif

namespace tfring {

#ifdef TFRING_WITH_NCCL

namespace {

// On the GPU that runs the kernel, ready once TensorFlow's stream gets there.
Status PlaceOnKernelStream(::tensorflow::OpKernelContext* ctx, TensorTableEntry* entry) {
  auto* stream = ctx->op_device_context()->stream();
  const int ordinal = stream->parent()->device_ordinal();
  if (ordinal < 0) {
    return Status::InvalidArgument("tfring: TensorFlow's stream for " + ctx->op_kernel().name() +
                                   " names no GPU");
  }
  entry->device = ordinal;
  return RecordReadyEvent(ordinal, stream->platform_specific_handle().stream,
                          &entry->ready_event);
}

bool OnGpu(::tensorflow::OpKernelContext* ctx) {
  ::tensorflow::DeviceContext* dc = ctx->op_device_context();
  return dc != nullptr && dc->stream() != nullptr;
}

}  // namespace

Status PlaceInput(::tensorflow::OpKernelContext* ctx, int input, TensorTableEntry* entry) {
  entry->device = kCpuDevice;
  if (!OnGpu(ctx) || ctx->input_memory_type(input) == ::tensorflow::HOST_MEMORY) {
    return Status::OK();
  }
  return PlaceOnKernelStream(ctx, entry);
}

Status PlaceVariable(::tensorflow::OpKernelContext* ctx, ::tensorflow::DataType dtype,
                     TensorTableEntry* entry) {
  entry->device = kCpuDevice;
  if (!OnGpu(ctx) || ::tensorflow::MTypeFromDType(dtype) == ::tensorflow::HOST_MEMORY) {
    return Status::OK();
  }
  return PlaceOnKernelStream(ctx, entry);
}

#else

// A CPU build registers CPU kernels only: every tensor is in host memory.
Status PlaceInput(::tensorflow::OpKernelContext*, int, TensorTableEntry* entry) {
  entry->device = kCpuDevice;
  return Status::OK();
}

Status PlaceVariable(::tensorflow::OpKernelContext*, ::tensorflow::DataType,
                     TensorTableEntry* entry) {
  entry->device = kCpuDevice;
  return Status::OK();
}

#endif

}  // namespace tfring
