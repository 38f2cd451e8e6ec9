// Tests of the TCP peers' framing (transport/tcp/peer_frame.*): the data
// and heartbeat header, encoded and parsed back, and each way a header is
// refused (a length above the limit, an unknown kind, non-zero reserved
// bytes, a heartbeat with a payload); and the handshake's HELLO and HELLO_OK
// through the frame parser. Built and run under ASan/UBSan by
// tests/common/transport/test_tcp_communicator.py (and by Bazel as
// //tf_ops:peer_frame_test); the seeded fuzz run of the same parser is
// fuzz/fuzz_peer_frame.cc.
#include <cstdint>
#include <string>

#include "../transport/tcp/peer_frame.h"
#include "../transport/tcp/wire.h"
#include "check.h"

using namespace tfring;
using namespace tfring::tcp;

namespace {

void TestHeaderParser() {
  uint8_t b[kPeerHeaderBytes];
  PeerHeader h, g;
  h.kind = PeerFrameKind::DATA;
  h.tag = -1;
  h.context = 0x0123456789abcdefull;
  h.length = (uint64_t(1) << 40);
  EncodePeerHeader(h, b);
  CHECK(ParsePeerHeader(b, &g).ok());
  CHECK(g.kind == h.kind && g.tag == -1 && g.context == h.context && g.length == h.length);
  b[23] = 1;  // above the limit
  CHECK(ParsePeerHeader(b, &g).cause() == WireCause::PROTOCOL_ERROR);
  EncodePeerHeader(h, b);
  b[0] = 9;
  CHECK(Contains(ParsePeerHeader(b, &g).message(), "unknown frame kind 9"));
  EncodePeerHeader(h, b);
  b[2] = 1;
  CHECK(!ParsePeerHeader(b, &g).ok());
  h.kind = PeerFrameKind::HEARTBEAT;
  h.length = 5;
  EncodePeerHeader(h, b);
  CHECK(Contains(ParsePeerHeader(b, &g).message(), "payload"));
  Hello hello;
  hello.client_rank = 2;
  hello.server_rank = 1;
  hello.size = 3;
  FrameParser p(kMaxHandshakeFrame);
  std::string f = EncodeHello(hello) + EncodeHelloOk(1);
  p.Feed(reinterpret_cast<const uint8_t*>(f.data()), f.size());
  Frame fr;
  bool have = false;
  Hello back;
  uint32_t rank = 0;
  CHECK(p.Next(&fr, &have).ok() && have && ParseHello(fr, &back).ok());
  CHECK(back.client_rank == 2 && back.server_rank == 1 && back.size == 3);
  CHECK(p.Next(&fr, &have).ok() && have && ParseHelloOk(fr, &rank).ok() && rank == 1);
}

}  // namespace

int main() {
  TestHeaderParser();
  return CheckExitCode();
}
