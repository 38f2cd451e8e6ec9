#include "fusion_buffer.h"

#include <cstdlib>

namespace tfring {

FusionLayout PlanFusion(const std::vector<int64_t>& byte_sizes) {
  FusionLayout layout;
  layout.offsets.reserve(byte_sizes.size());
  for (int64_t b : byte_sizes) {
    layout.offsets.push_back(layout.total_bytes);
    layout.total_bytes += b;
  }
  return layout;
}

void FusionBuffer::FreeDeleter::operator()(void* p) const { std::free(p); }

void* FusionBuffer::Get(int64_t bytes) {
  if (bytes > capacity_ || !data_) {
    // Grow geometrically so a slowly increasing workload does not reallocate
    // every cycle.
    int64_t cap = capacity_ * 2 > bytes ? capacity_ * 2 : bytes;
    cap = ((cap + 63) / 64) * 64;
    if (cap == 0) cap = 64;
    data_.reset(std::aligned_alloc(64, static_cast<size_t>(cap)));
    capacity_ = data_ ? cap : 0;
  }
  return data_.get();
}

}  // namespace tfring
