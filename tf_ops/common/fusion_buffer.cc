#include "fusion_buffer.h"

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

void* FusionBuffer::Get(int64_t bytes) {
  int64_t capacity = int64_t(data_.size());
  if (bytes > capacity || data_.empty()) {
    // Grow geometrically so a slowly increasing workload does not remap
    // every cycle.
    int64_t cap = capacity * 2 > bytes ? capacity * 2 : bytes;
    cap = ((cap + 63) / 64) * 64;
    if (cap == 0) cap = 64;
    try {
      data_.Reserve(size_t(cap));
    } catch (const std::bad_alloc&) {
      return nullptr;  // as aligned_alloc did: the caller reports it
    }
  }
  return data_.data();
}

}  // namespace tfring
