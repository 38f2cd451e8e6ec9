// Fuzz target for the rank-to-rank wire (transport/tcp/peer_frame.*):
// arbitrary bytes go through the handshake frames a listener reads before a
// peer is trusted (AUTH, HELLO, HELLO_OK) and through the data stream's
// header walk (24-byte header, then `length` bytes skipped). Nothing may
// crash, read out of bounds (ASan), accept a length above the limit, or
// accept a header that does not encode back to the same bytes.
//
// With libFuzzer:  clang++ -fsanitize=fuzzer,address,undefined ... fuzz_peer_frame.cc
// Without it (-DTFRING_SEEDED_DRIVER): fuzz_peer_frame SEED ITERATIONS [SECONDS]
// mutates valid streams and prints "executions N crashes 0".
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../transport/tcp/peer_frame.h"
#include "../../transport/tcp/wire.h"

using namespace tfring::tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool handshake = data[0] & 1;
  ++data;
  --size;
  if (handshake) {
    FrameParser parser(kMaxHandshakeFrame);
    parser.Feed(data, size);
    for (;;) {
      Frame f;
      bool have = false;
      if (!parser.Next(&f, &have).ok() || !have) break;
      if (f.body.size() + 1 > kMaxHandshakeFrame) __builtin_trap();
      Auth a;
      Hello h;
      uint32_t rank;
      ParseAuth(f, &a);
      // An accepted HELLO encodes back to the same bytes.
      if (ParseHello(f, &h).ok() &&
          EncodeHello(h).substr(4) != std::string(1, char(f.type)) + f.body) {
        __builtin_trap();
      }
      ParseHelloOk(f, &rank);
    }
    return 0;
  }
  // The data stream: header, payload, header, ... as the receiver walks it.
  size_t off = 0;
  while (size - off >= kPeerHeaderBytes) {
    PeerHeader h;
    if (!ParsePeerHeader(data + off, &h).ok()) return 0;  // the connection would be failed
    if (h.length > kMaxPeerMessage) __builtin_trap();
    // Only DATA and ABORT carry a body, and an ABORT's is small.
    if (h.kind == PeerFrameKind::ABORT ? h.length > kMaxAbortBody
                                       : h.kind != PeerFrameKind::DATA && h.length != 0) {
      __builtin_trap();
    }
    uint8_t back[kPeerHeaderBytes];
    EncodePeerHeader(h, back);
    if (std::memcmp(back, data + off, kPeerHeaderBytes) != 0) __builtin_trap();
    off += kPeerHeaderBytes;
    if (h.length > size - off) return 0;  // the rest would arrive later
    if (h.kind == PeerFrameKind::ABORT) {
      // An accepted notice encodes back to the same bytes.
      const std::string body(reinterpret_cast<const char*>(data + off), size_t(h.length));
      AbortNotice a;
      if (ParseAbort(body, &a).ok() && EncodeAbort(a) != body) __builtin_trap();
    }
    off += size_t(h.length);
  }
  return 0;
}

#ifdef TFRING_SEEDED_DRIVER
#include "seeded_driver.h"

static std::string Header(PeerFrameKind kind, int32_t tag, uint64_t ctx, uint64_t len) {
  PeerHeader h;
  h.kind = kind;
  h.tag = tag;
  h.context = ctx;
  h.length = len;
  uint8_t b[kPeerHeaderBytes];
  EncodePeerHeader(h, b);
  return std::string(reinterpret_cast<char*>(b), sizeof(b));
}

static std::vector<std::string> Seeds() {
  Hello h;
  h.client_rank = 2;
  h.server_rank = 1;
  h.size = 3;
  AbortNotice notice;
  notice.failed_rank = 2;
  notice.cause = 1;
  notice.detail = "3.1 s (heartbeat interval 1.0 s)";
  const std::string abort = EncodeAbort(notice);
  return {
      std::string(1, '\x00') + Header(PeerFrameKind::ABORT, 0, 0, abort.size()) + abort,
      std::string(1, '\x00') + Header(PeerFrameKind::DATA, 5, 77, 3) + "abc" +
          Header(PeerFrameKind::HEARTBEAT, 0, 0, 0) + Header(PeerFrameKind::DATA, -1, 9, 0) +
          Header(PeerFrameKind::GOODBYE, 0, 0, 0),
      std::string(1, '\x01') + Writer(kAuth).Raw(std::string(32, 'c')).Bytes(kPeerContext)
                                   .Raw(std::string(32, 'm')).Frame() + EncodeHello(h),
      std::string(1, '\x01') + EncodeHelloOk(4),
  };
}

static void Mutate(std::string* s, std::mt19937_64& rng) {
  int rounds = 1 + int(rng() % 4);
  for (int k = 0; k < rounds; ++k) {
    size_t n = s->size();
    switch (rng() % 6) {
      case 0:
        if (n > 1) (*s)[1 + rng() % (n - 1)] ^= char(1 << (rng() % 8));
        break;
      case 1:
        if (n > 1) (*s)[1 + rng() % (n - 1)] = char(rng());
        break;
      case 2:
        s->insert(n ? 1 + rng() % n : 0, std::string(1 + rng() % 8, char(rng())));
        break;
      case 3:
        if (n > 2) s->erase(1 + rng() % (n - 1), 1 + rng() % 16);
        break;
      case 4: {  // an interesting 8-byte length somewhere
        static const uint64_t kLens[] = {0, 1, 255, 1u << 20, uint64_t(1) << 40,
                                         (uint64_t(1) << 40) + 1, ~uint64_t(0)};
        uint64_t v = kLens[rng() % 7];
        if (n >= 9) {
          size_t a = 1 + rng() % (n - 8);
          for (int i = 0; i < 8; ++i) (*s)[a + i] = char(v >> (56 - 8 * i));
        }
        break;
      }
      default:
        *s = std::string(1 + rng() % 96, '\0');
        for (char& c : *s) c = char(rng());
    }
    if (s->size() > 4096) s->resize(4096);
  }
}

int main(int argc, char** argv) { return RunSeededDriver(argc, argv, Seeds(), Mutate); }
#endif
