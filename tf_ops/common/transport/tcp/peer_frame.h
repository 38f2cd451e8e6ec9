// The rank-to-rank part of tfring's TCP wire (docs/wire.md, "Rank-to-rank
// connections"): the HELLO that follows the handshake and the fixed header of
// every frame after it. Pure encoding and parsing, no sockets, so the fuzz
// harness drives it with arbitrary bytes.
#ifndef TFRING_TRANSPORT_TCP_PEER_FRAME_H
#define TFRING_TRANSPORT_TCP_PEER_FRAME_H

#include <cstddef>
#include <cstdint>
#include <string>

#include "wire.h"

namespace tfring {
namespace tcp {

// The context both sides put into the proofs of a rank-to-rank connection.
extern const char kPeerContext[];

// Handshake-phase messages (framed like every handshake message, <= 256 bytes).
constexpr uint8_t kHello = 0x30;
constexpr uint8_t kHelloOk = 0x31;

struct Hello {
  uint32_t client_rank = 0;  // the connecting rank
  uint32_t server_rank = 0;  // the rank it believes it reached
  uint32_t size = 0;         // the world size it was started with
};
std::string EncodeHello(const Hello& h);
WireStatus ParseHello(const Frame& f, Hello* out);
std::string EncodeHelloOk(uint32_t server_rank);
WireStatus ParseHelloOk(const Frame& f, uint32_t* server_rank);

// After HELLO_OK the stream is a sequence of frames with this 24-byte header:
//   u8 kind | 3 zero bytes | i32 tag | u64 context | u64 length   (big-endian)
// followed by `length` payload bytes (DATA; ABORT up to kMaxAbortBody; 0 for the others).
constexpr size_t kPeerHeaderBytes = 24;
// A single message may not claim more than this (1 TiB): a corrupt length
// is refused before anything is allocated, and payloads are only ever
// buffered as their bytes actually arrive.
constexpr uint64_t kMaxPeerMessage = uint64_t{1} << 40;

enum class PeerFrameKind : uint8_t {
  DATA = 1,
  HEARTBEAT = 2,  // "still alive": sent on a connection idle for half an interval
  GOODBYE = 3,    // orderly close: nothing follows on this connection
  ABORT = 4,      // the sender saw another rank fail (body: EncodeAbort); it stops
};

// An ABORT body: which rank failed and why, so every survivor names the rank
// that failed first rather than the one that stopped talking to it after.
constexpr uint64_t kMaxAbortBody = 1024;
struct AbortNotice {
  uint32_t failed_rank = 0;
  uint8_t cause = 0;   // the sender's typed cause (world.h's PeerFailure)
  std::string detail;  // e.g. "3.1 s (heartbeat interval 1.0 s)"
};
std::string EncodeAbort(const AbortNotice& a);
WireStatus ParseAbort(const std::string& body, AbortNotice* out);

struct PeerHeader {
  PeerFrameKind kind = PeerFrameKind::DATA;
  int32_t tag = 0;       // >= 0: the user's tag; < 0: internal (Split/Dup)
  uint64_t context = 0;  // which communicator of the world
  uint64_t length = 0;
};

void EncodePeerHeader(const PeerHeader& h, uint8_t out[kPeerHeaderBytes]);
// PROTOCOL_ERROR naming the problem for an unknown kind, non-zero reserved
// bytes, a length above kMaxPeerMessage, or a length a control frame cannot have.
WireStatus ParsePeerHeader(const uint8_t in[kPeerHeaderBytes], PeerHeader* out);

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_PEER_FRAME_H
