// Whether this TensorFlow's headers let tfring lower its collectives into
// XLA: TF2XLA's op registry, XLA's builder (xla/client/ up to TF 2.18,
// xla/hlo/builder/ from 2.19) and the typed FFI API of custom calls.
// TFRING_XLA_KERNELS is 1 when they are all there; otherwise the XLA files
// compile to nothing, tfring's ops have no XLA kernels, and tfring.keras
// runs a DistributedOptimizer's step without XLA (tfring/keras/xla.py).
#ifndef TFRING_TENSORFLOW_XLA_XLA_SUPPORT_H
#define TFRING_TENSORFLOW_XLA_XLA_SUPPORT_H

#if __has_include("tensorflow/compiler/tf2xla/xla_op_kernel.h") &&   \
    __has_include("tensorflow/compiler/tf2xla/xla_op_registry.h") && \
    __has_include("xla/ffi/api/ffi.h") && __has_include("xla/ffi/api/c_api_internal.h")
#if __has_include("xla/hlo/builder/xla_builder.h")
#define TFRING_XLA_BUILDER_HEADER "xla/hlo/builder/xla_builder.h"
#define TFRING_XLA_KERNELS 1
#elif __has_include("xla/client/xla_builder.h")
#define TFRING_XLA_BUILDER_HEADER "xla/client/xla_builder.h"
#define TFRING_XLA_KERNELS 1
#endif
#endif

#ifndef TFRING_XLA_KERNELS
#define TFRING_XLA_KERNELS 0
#endif

namespace tfring {

// The custom call every collective lowers to; its handlers are registered
// for XLA's host platform and, in a GPU build, for CUDA.
constexpr char kXlaCollectiveTarget[] = "tfring_collective";

}  // namespace tfring

#endif  // TFRING_TENSORFLOW_XLA_XLA_SUPPORT_H
