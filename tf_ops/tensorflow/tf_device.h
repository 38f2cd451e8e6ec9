// Where a TensorFlow kernel's tensor lives, told to the core: host memory, or
// a GPU together with an event recorded on the stream TensorFlow queues that
// GPU's kernels on, so that the core negotiates the tensor only once the
// kernels producing it have run (tensor_queue.h). The core's own stream then
// runs the collective, and the op is done only when that has finished.
#ifndef TFRING_TENSORFLOW_TF_DEVICE_H
#define TFRING_TENSORFLOW_TF_DEVICE_H

#include "tensorflow/core/framework/op_kernel.h"

#include "../common/tensor_queue.h"

namespace tfring {

// Sets `entry`'s device (and, on a GPU, its ready event) for input `input`
// of the kernel running in `ctx`. A CPU kernel's tensors, and those that
// TensorFlow keeps in host memory even for a GPU kernel (int32 tensors,
// HostMemory arguments), stay on the CPU.
Status PlaceInput(::tensorflow::OpKernelContext* ctx, int input, TensorTableEntry* entry);
// The same for a `dtype` tensor that the kernel reaches through a resource
// (a variable's buffer), which lives on the kernel's device unless
// TensorFlow keeps that dtype in host memory there.
Status PlaceVariable(::tensorflow::OpKernelContext* ctx, ::tensorflow::DataType dtype,
                     TensorTableEntry* entry);

}  // namespace tfring

#endif  // TFRING_TENSORFLOW_TF_DEVICE_H
