// tfring's TCP wire: framing, message encoding and the typed errors of the
// transport. docs/wire.md is the specification; tfring/runner/wire.py is the
// Python side of the same protocol. Everything here is pure (no sockets), so
// the parser can be fuzzed on arbitrary bytes.
#ifndef TFRING_TRANSPORT_TCP_WIRE_H
#define TFRING_TRANSPORT_TCP_WIRE_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../status.h"

namespace tfring {
namespace tcp {

constexpr char kMagic[4] = {'T', 'F', 'R', 'G'};
constexpr uint8_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr uint32_t kMaxFrame = 1u << 20;        // after authentication
constexpr uint32_t kMaxHandshakeFrame = 256;    // before authentication
constexpr size_t kMaxContext = 64;
constexpr size_t kMinSecretBytes = 16;

enum MsgType : uint8_t {
  kChallenge = 0x01,
  kAuth = 0x02,
  kAuthOk = 0x03,
  kSet = 0x10,
  kGet = 0x11,
  kAdd = 0x12,
  kWaitKeys = 0x13,
  kWaitPrefix = 0x14,
  kDeleteScope = 0x15,
  kPing = 0x16,
  kOk = 0x20,
  kValue = 0x21,
  kInt = 0x22,
  kEntries = 0x23,
  kError = 0x2F,
};

// Why a wire operation failed. Callers branch on this, never on the text.
enum class WireCause : int {
  NONE = 0,
  TIMEOUT = 1,
  PROTOCOL_ERROR = 2,
  AUTH_FAILED = 3,
  INVALID_ARGUMENT = 4,
  SHUTTING_DOWN = 5,
  PEER_CLOSED = 6,
  IO_ERROR = 7,
};

const char* WireCauseName(WireCause c);

// A Status plus its typed cause. ToStatus() gives the core's Status: a bad
// argument stays INVALID_ARGUMENT, everything else means the connection (and
// so the job's communication) cannot go on: ABORTED.
class WireStatus {
 public:
  WireStatus() = default;
  static WireStatus OK() { return WireStatus(); }
  static WireStatus Error(WireCause cause, std::string message) {
    WireStatus s;
    s.cause_ = cause;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return cause_ == WireCause::NONE; }
  WireCause cause() const { return cause_; }
  const std::string& message() const { return message_; }
  // Adds what was being done ("rendezvous 127.0.0.1:4000: get 'x'") in front.
  WireStatus Context(const std::string& what) const;
  Status ToStatus() const;

 private:
  WireCause cause_ = WireCause::NONE;
  std::string message_;
};

#define TFRING_WIRE_RETURN_IF_ERROR(expr)  \
  do {                                     \
    ::tfring::tcp::WireStatus _ws = (expr); \
    if (!_ws.ok()) return _ws;             \
  } while (0)

// Appends big-endian fields to a payload.
class Writer {
 public:
  explicit Writer(uint8_t type) { buf_.push_back(type); }
  Writer& U8(uint8_t v);
  Writer& U32(uint32_t v);
  Writer& I64(int64_t v);
  Writer& Raw(const std::string& b);
  Writer& Bytes(const std::string& b);  // u32 length + bytes
  // The frame: 4-byte big-endian payload length, then the payload.
  std::string Frame() const;

 private:
  std::string buf_;
};

// Reads fields from one payload; every read is bounds-checked and returns
// PROTOCOL_ERROR on a short or malformed payload, never reads past it.
class Reader {
 public:
  Reader(const uint8_t* data, size_t len) : p_(data), n_(len) {}
  WireStatus U8(uint8_t* v);
  WireStatus U32(uint32_t* v);
  WireStatus I64(int64_t* v);
  WireStatus Raw(size_t n, std::string* out);
  WireStatus Bytes(std::string* out, size_t limit = kMaxFrame);
  WireStatus End() const;

 private:
  const uint8_t* p_;
  size_t n_;
  size_t i_ = 0;
};

struct Frame {
  uint8_t type = 0;
  std::string body;  // the payload after the type byte
};

// Incremental frame parser: Feed bytes as they arrive, take frames out. A
// length above `max_payload` or of 0 is a PROTOCOL_ERROR before anything is
// allocated for it, so a hostile length prefix costs nothing.
class FrameParser {
 public:
  explicit FrameParser(uint32_t max_payload) : max_payload_(max_payload) {}
  void set_max_payload(uint32_t m) { max_payload_ = m; }
  void Feed(const uint8_t* data, size_t len) {
    pending_.append(reinterpret_cast<const char*>(data), len);
  }
  // OK with *have=true and a frame, OK with *have=false (needs more bytes),
  // or PROTOCOL_ERROR (the stream is unusable from here on).
  WireStatus Next(Frame* out, bool* have);
  // Bytes still needed to finish the frame in progress (at least 1), so a
  // reader asks the socket for no more than that.
  size_t Wanted() const;
  bool mid_frame() const { return !pending_.empty(); }

 private:
  uint32_t max_payload_;
  std::string pending_;
};

// Message bodies (the client and, later, rank-to-rank servers use these).
struct Challenge {
  std::string nonce;
};
struct Auth {
  std::string client_nonce, context, mac;
};
struct ErrorReply {
  uint8_t code = 0;
  std::string message;
};

WireStatus ParseChallenge(const Frame& f, Challenge* out);
WireStatus ParseAuth(const Frame& f, Auth* out);
WireStatus ParseAuthOk(const Frame& f, std::string* mac);
WireStatus ParseError(const Frame& f, ErrorReply* out);
WireStatus ParseValue(const Frame& f, std::string* value);
WireStatus ParseInt(const Frame& f, int64_t* value);
WireStatus ParseEntries(const Frame& f, std::vector<std::pair<std::string, std::string>>* out);
// An ERROR frame as the WireStatus it carries; any other frame type that
// the caller did not expect as PROTOCOL_ERROR naming both types.
WireStatus UnexpectedReply(const Frame& f, uint8_t expected);

// Proofs of the challenge-response (docs/wire.md, "Authentication").
std::string ClientMac(const std::string& secret, const std::string& server_nonce,
                      const std::string& client_nonce, const std::string& context);
std::string ServerMac(const std::string& secret, const std::string& server_nonce,
                      const std::string& client_nonce, const std::string& context);

// Decodes the hex secret of TFRING_SECRET; INVALID_ARGUMENT naming the
// problem if it is not hex or shorter than kMinSecretBytes.
WireStatus DecodeSecretHex(const std::string& hex, std::string* secret);

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_WIRE_H
