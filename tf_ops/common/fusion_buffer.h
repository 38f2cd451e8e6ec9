// Tensor fusion: many small allreduces of one dtype are packed back to back
// into one buffer, reduced by a single collective, and unpacked. The buffer
// is kept between cycles and only grows, so steady state allocates nothing.
#ifndef TFRING_COMMON_FUSION_BUFFER_H
#define TFRING_COMMON_FUSION_BUFFER_H

#include <cstdint>
#include <memory>
#include <vector>

#include "mapped_buffer.h"

namespace tfring {

struct FusionLayout {
  std::vector<int64_t> offsets;  // byte offset of each tensor in the buffer
  int64_t total_bytes = 0;
};

// Tensors are packed without padding so that the fused buffer is one array
// of the common dtype.
FusionLayout PlanFusion(const std::vector<int64_t>& byte_sizes);

class FusionBuffer {
 public:
  // A buffer of at least `bytes`, page-aligned; valid until the next call.
  void* Get(int64_t bytes);
  int64_t capacity() const { return int64_t(data_.size()); }

 private:
  // Mapped, so that the executor's end (a reset) returns it to the OS.
  MappedBuffer data_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_FUSION_BUFFER_H
