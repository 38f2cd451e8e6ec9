// The real NcclApi: libnccl.so.2 and the CUDA runtime. Compiled only when
// tfring is built for GPUs (TFRING_WITH_NCCL).
#ifndef TFRING_COMMON_OPS_CUDA_CUDA_NCCL_API_H
#define TFRING_COMMON_OPS_CUDA_CUDA_NCCL_API_H

#include <memory>

#include "../nccl_api.h"

namespace tfring {

// One instance per process is enough; it holds no state.
std::unique_ptr<NcclApi> CreateCudaNcclApi();

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_CUDA_CUDA_NCCL_API_H
