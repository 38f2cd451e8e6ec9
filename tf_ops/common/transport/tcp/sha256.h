// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), self-contained so that the
// TCP transport's authentication adds no external dependency to the core.
#ifndef TFRING_TRANSPORT_TCP_SHA256_H
#define TFRING_TRANSPORT_TCP_SHA256_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace tfring {
namespace tcp {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t len);
  Digest Finish();

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

Digest Sha256Of(const void* data, size_t len);

// HMAC-SHA256 over the concatenation of `parts`.
Digest HmacSha256(const std::string& key, std::initializer_list<std::string> parts);

// Compares in time that depends only on the lengths, never on where the
// first differing byte is: a peer cannot learn a proof byte by byte.
bool ConstantTimeEqual(const void* a, const void* b, size_t len);

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_SHA256_H
