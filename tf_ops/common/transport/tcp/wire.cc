#include "wire.h"

#include <cstdio>
#include <cstring>

#include "sha256.h"

namespace tfring {
namespace tcp {
namespace {

const char kClientLabel[] = "tfring-wire-v1 client";  // + NUL, as in wire.py
const char kServerLabel[] = "tfring-wire-v1 server";

std::string Label(const char* text) { return std::string(text, std::strlen(text) + 1); }

std::string Hex(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02x", b);
  return buf;
}

WireStatus Protocol(std::string m) {
  return WireStatus::Error(WireCause::PROTOCOL_ERROR, std::move(m));
}

WireStatus Expect(const Frame& f, uint8_t type) {
  if (f.type == type) return WireStatus::OK();
  return UnexpectedReply(f, type);
}

}  // namespace

const char* WireCauseName(WireCause c) {
  switch (c) {
    case WireCause::NONE: return "OK";
    case WireCause::TIMEOUT: return "TIMEOUT";
    case WireCause::PROTOCOL_ERROR: return "PROTOCOL_ERROR";
    case WireCause::AUTH_FAILED: return "AUTH_FAILED";
    case WireCause::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case WireCause::SHUTTING_DOWN: return "SHUTTING_DOWN";
    case WireCause::PEER_CLOSED: return "PEER_CLOSED";
    case WireCause::IO_ERROR: return "IO_ERROR";
  }
  return "UNKNOWN";
}

WireStatus WireStatus::Context(const std::string& what) const {
  if (ok()) return *this;
  return Error(cause_, what + ": " + message_);
}

Status WireStatus::ToStatus() const {
  if (ok()) return Status::OK();
  std::string m = message_ + " (" + WireCauseName(cause_) + ")";
  if (cause_ == WireCause::INVALID_ARGUMENT) return Status::InvalidArgument(m);
  return Status::Aborted(m);
}

Writer& Writer::U8(uint8_t v) {
  buf_.push_back(char(v));
  return *this;
}
Writer& Writer::U32(uint32_t v) {
  for (int i = 3; i >= 0; --i) buf_.push_back(char(v >> (8 * i)));
  return *this;
}
Writer& Writer::I64(int64_t v) {
  uint64_t u = uint64_t(v);
  for (int i = 7; i >= 0; --i) buf_.push_back(char(u >> (8 * i)));
  return *this;
}
Writer& Writer::Raw(const std::string& b) {
  buf_ += b;
  return *this;
}
Writer& Writer::Bytes(const std::string& b) {
  U32(uint32_t(b.size()));
  return Raw(b);
}
std::string Writer::Frame() const {
  std::string out;
  uint32_t n = uint32_t(buf_.size());
  for (int i = 3; i >= 0; --i) out.push_back(char(n >> (8 * i)));
  return out + buf_;
}

WireStatus Reader::Raw(size_t n, std::string* out) {
  if (n > n_ - i_) {
    return Protocol("truncated message: wanted " + std::to_string(n) + " bytes at offset " +
                    std::to_string(i_) + " of a " + std::to_string(n_) + "-byte payload");
  }
  out->assign(reinterpret_cast<const char*>(p_ + i_), n);
  i_ += n;
  return WireStatus::OK();
}
WireStatus Reader::U8(uint8_t* v) {
  std::string b;
  TFRING_WIRE_RETURN_IF_ERROR(Raw(1, &b));
  *v = uint8_t(b[0]);
  return WireStatus::OK();
}
WireStatus Reader::U32(uint32_t* v) {
  std::string b;
  TFRING_WIRE_RETURN_IF_ERROR(Raw(4, &b));
  *v = 0;
  for (int i = 0; i < 4; ++i) *v = (*v << 8) | uint8_t(b[i]);
  return WireStatus::OK();
}
WireStatus Reader::I64(int64_t* v) {
  std::string b;
  TFRING_WIRE_RETURN_IF_ERROR(Raw(8, &b));
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | uint8_t(b[i]);
  *v = int64_t(u);
  return WireStatus::OK();
}
WireStatus Reader::Bytes(std::string* out, size_t limit) {
  uint32_t n;
  TFRING_WIRE_RETURN_IF_ERROR(U32(&n));
  if (n > limit) {
    return Protocol("field of " + std::to_string(n) + " bytes exceeds its limit of " +
                    std::to_string(limit));
  }
  return Raw(n, out);
}
WireStatus Reader::End() const {
  if (i_ != n_) return Protocol(std::to_string(n_ - i_) + " unexpected trailing bytes");
  return WireStatus::OK();
}

size_t FrameParser::Wanted() const {
  if (pending_.size() < 4) return 4 - pending_.size();
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | uint8_t(pending_[i]);
  if (n == 0 || n > max_payload_) return 1;  // Next() reports the error
  size_t have = pending_.size() - 4;
  return have < n ? n - have : 1;
}

WireStatus FrameParser::Next(Frame* out, bool* have) {
  *have = false;
  if (pending_.size() < 4) return WireStatus::OK();
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | uint8_t(pending_[i]);
  if (n == 0) return Protocol("empty frame (length 0)");
  if (n > max_payload_) {
    return Protocol("frame of " + std::to_string(n) + " bytes exceeds the maximum of " +
                    std::to_string(max_payload_));
  }
  if (pending_.size() - 4 < n) return WireStatus::OK();
  out->type = uint8_t(pending_[4]);
  out->body.assign(pending_, 5, n - 1);
  pending_.erase(0, 4 + size_t(n));
  *have = true;
  return WireStatus::OK();
}

static Reader BodyReader(const Frame& f) {
  return Reader(reinterpret_cast<const uint8_t*>(f.body.data()), f.body.size());
}

WireStatus ParseChallenge(const Frame& f, Challenge* out) {
  TFRING_WIRE_RETURN_IF_ERROR(Expect(f, kChallenge));
  Reader r = BodyReader(f);
  std::string magic;
  uint8_t version;
  TFRING_WIRE_RETURN_IF_ERROR(r.Raw(4, &magic));
  if (magic != std::string(kMagic, 4)) {
    return Protocol("the peer is not a tfring endpoint (bad magic)");
  }
  TFRING_WIRE_RETURN_IF_ERROR(r.U8(&version));
  if (version != kVersion) {
    return Protocol("the peer speaks wire version " + std::to_string(version) +
                    ", this side " + std::to_string(kVersion));
  }
  TFRING_WIRE_RETURN_IF_ERROR(r.Raw(kNonceBytes, &out->nonce));
  return r.End();
}

WireStatus ParseAuth(const Frame& f, Auth* out) {
  TFRING_WIRE_RETURN_IF_ERROR(Expect(f, kAuth));
  Reader r = BodyReader(f);
  TFRING_WIRE_RETURN_IF_ERROR(r.Raw(kNonceBytes, &out->client_nonce));
  TFRING_WIRE_RETURN_IF_ERROR(r.Bytes(&out->context, kMaxContext));
  TFRING_WIRE_RETURN_IF_ERROR(r.Raw(kMacBytes, &out->mac));
  return r.End();
}

WireStatus ParseAuthOk(const Frame& f, std::string* mac) {
  TFRING_WIRE_RETURN_IF_ERROR(Expect(f, kAuthOk));
  Reader r = BodyReader(f);
  TFRING_WIRE_RETURN_IF_ERROR(r.Raw(kMacBytes, mac));
  return r.End();
}

WireStatus ParseError(const Frame& f, ErrorReply* out) {
  if (f.type != kError) return Protocol("expected an ERROR frame, got type " + Hex(f.type));
  Reader r = BodyReader(f);
  TFRING_WIRE_RETURN_IF_ERROR(r.U8(&out->code));
  TFRING_WIRE_RETURN_IF_ERROR(r.Bytes(&out->message));
  return r.End();
}

WireStatus ParseValue(const Frame& f, std::string* value) {
  TFRING_WIRE_RETURN_IF_ERROR(Expect(f, kValue));
  Reader r = BodyReader(f);
  TFRING_WIRE_RETURN_IF_ERROR(r.Bytes(value));
  return r.End();
}

WireStatus ParseInt(const Frame& f, int64_t* value) {
  TFRING_WIRE_RETURN_IF_ERROR(Expect(f, kInt));
  Reader r = BodyReader(f);
  TFRING_WIRE_RETURN_IF_ERROR(r.I64(value));
  return r.End();
}

WireStatus ParseEntries(const Frame& f, std::vector<std::pair<std::string, std::string>>* out) {
  TFRING_WIRE_RETURN_IF_ERROR(Expect(f, kEntries));
  Reader r = BodyReader(f);
  uint32_t n;
  TFRING_WIRE_RETURN_IF_ERROR(r.U32(&n));
  // Each entry takes at least 8 bytes, so a count the body cannot hold is
  // refused before reserving anything for it.
  if (n > f.body.size() / 8) {
    return Protocol("ENTRIES claims " + std::to_string(n) + " entries in a " +
                    std::to_string(f.body.size()) + "-byte body");
  }
  out->clear();
  out->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::string k, v;
    TFRING_WIRE_RETURN_IF_ERROR(r.Bytes(&k));
    TFRING_WIRE_RETURN_IF_ERROR(r.Bytes(&v));
    out->emplace_back(std::move(k), std::move(v));
  }
  return r.End();
}

WireStatus UnexpectedReply(const Frame& f, uint8_t expected) {
  if (f.type == kError) {
    ErrorReply e;
    WireStatus s = ParseError(f, &e);
    if (!s.ok()) return s;
    WireCause cause = (e.code >= 1 && e.code <= 5) ? WireCause(e.code) : WireCause::PROTOCOL_ERROR;
    return WireStatus::Error(cause, e.message);
  }
  return Protocol("expected message type " + Hex(expected) + ", got " + Hex(f.type));
}

std::string ClientMac(const std::string& secret, const std::string& server_nonce,
                      const std::string& client_nonce, const std::string& context) {
  Digest d = HmacSha256(secret, {Label(kClientLabel), server_nonce, client_nonce, context});
  return std::string(d.begin(), d.end());
}

std::string ServerMac(const std::string& secret, const std::string& server_nonce,
                      const std::string& client_nonce, const std::string& context) {
  Digest d = HmacSha256(secret, {Label(kServerLabel), server_nonce, client_nonce, context});
  return std::string(d.begin(), d.end());
}

WireStatus DecodeSecretHex(const std::string& hex, std::string* secret) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) {
    return WireStatus::Error(WireCause::INVALID_ARGUMENT,
                             "TFRING_SECRET must be a hex string, got an odd number of digits");
  }
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) {
      return WireStatus::Error(WireCause::INVALID_ARGUMENT,
                               "TFRING_SECRET must be a hex string, got a non-hex character");
    }
    out.push_back(char(hi * 16 + lo));
  }
  if (out.size() < kMinSecretBytes) {
    return WireStatus::Error(WireCause::INVALID_ARGUMENT,
                             "TFRING_SECRET must hold at least " + std::to_string(kMinSecretBytes) +
                                 " bytes, got " + std::to_string(out.size()));
  }
  *secret = std::move(out);
  return WireStatus::OK();
}

}  // namespace tcp
}  // namespace tfring
