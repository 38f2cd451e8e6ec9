// A buffer whose lifetime is a world (a connection's staging buffer, a data
// plane's scratch, the fusion buffer): mapped straight from the kernel and
// unmapped when it goes, so a reset gives the memory back to the OS.
//
// Why not std::vector or malloc: glibc serves a 256 KB block from mmap only
// until the first such block is freed; then its dynamic mmap threshold rises
// above that size and every later block of it comes from the heap, which
// glibc keeps after it is freed. A worker that reset into a larger world
// grew by a staging buffer per peer that way (issue 40). Setting mallopt
// from a library would change the whole process, so these buffers bypass
// malloc instead. Allocation happens only on construction or growth, never
// on a steady-state collective.
#ifndef TFRING_COMMON_MAPPED_BUFFER_H
#define TFRING_COMMON_MAPPED_BUFFER_H

#include <sys/mman.h>

#include <cstddef>
#include <new>
#include <utility>

namespace tfring {

class MappedBuffer {
 public:
  MappedBuffer() = default;
  // Zero-filled, page-aligned; throws std::bad_alloc when the kernel refuses.
  explicit MappedBuffer(size_t bytes) { Map(bytes); }
  ~MappedBuffer() { Unmap(); }
  MappedBuffer(MappedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedBuffer& operator=(MappedBuffer&& o) noexcept {
    if (this != &o) {
      Unmap();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // At least `bytes` long afterwards; the contents are not kept when it
  // grows (every user refills it), and nothing is mapped when it is already
  // large enough.
  void Reserve(size_t bytes) {
    if (bytes <= size_) return;
    Unmap();
    Map(bytes);
  }

 private:
  void Map(size_t bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char*>(p);
    size_ = bytes;
  }
  void Unmap() {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }

  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tfring

#endif  // TFRING_COMMON_MAPPED_BUFFER_H
