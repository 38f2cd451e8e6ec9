// Tests of the TCP transport's wire pieces, run under ASan/UBSan by
// tests/common/transport/test_tcp_cpp.py (also a Bazel cc_test: no argument = unit).
//   tcp_client_test unit                   pure tests (SHA-256, HMAC, parser, topology)
//   tcp_client_test store HOST PORT SCOPE N  a session against a live rendezvous store
//                                          (secret from TFRING_SECRET), then registers N
//                                          fake ranks and prints the derived topology
//   tcp_client_test connect HOST PORT SECONDS  connects once, prints "CAUSE message"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../transport/tcp/rendezvous_client.h"
#include "../transport/tcp/sha256.h"
#include "../transport/tcp/topology.h"
#include "../transport/tcp/wire.h"

using namespace tfring::tcp;

static int g_failed = 0, g_passed = 0;
#define CHECK(cond)                                                  \
  do {                                                               \
    if (cond) {                                                      \
      ++g_passed;                                                    \
    } else {                                                         \
      ++g_failed;                                                    \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);  \
    }                                                                \
  } while (0)

static std::string ToHex(const Digest& d) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s.push_back(k[b >> 4]);
    s.push_back(k[b & 15]);
  }
  return s;
}

static bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

static void TestSha256() {
  CHECK(ToHex(Sha256Of("", 0)) ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(ToHex(Sha256Of("abc", 3)) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char* two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(ToHex(Sha256Of(two_blocks, std::strlen(two_blocks))) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  Sha256 chunked;  // uneven pieces exercise the block buffering
  for (size_t off = 0; off < million.size(); off += 997) {
    chunked.Update(million.data() + off, std::min<size_t>(997, million.size() - off));
  }
  CHECK(ToHex(chunked.Finish()) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // RFC 4231 test cases 1 and 2, and 6 (a key longer than the block).
  CHECK(ToHex(HmacSha256(std::string(20, '\x0b'), {"Hi There"})) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(ToHex(HmacSha256("Jefe", {"what do ya want ", "for nothing?"})) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(ToHex(HmacSha256(std::string(131, '\xaa'),
                         {"Test Using Larger Than Block-Size Key - Hash Key First"})) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(ConstantTimeEqual("abcd", "abcd", 4));
  CHECK(!ConstantTimeEqual("abcd", "abce", 4));
}

static void TestParser() {
  // Two frames split at every byte boundary come out whole and in order.
  std::string stream = Writer(kValue).Bytes("hello").Frame() + Writer(kInt).I64(-5).Frame();
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    FrameParser p(kMaxFrame);
    std::vector<Frame> got;
    for (size_t part = 0; part < 2; ++part) {
      size_t a = part == 0 ? 0 : cut, b = part == 0 ? cut : stream.size();
      p.Feed(reinterpret_cast<const uint8_t*>(stream.data()) + a, b - a);
      Frame f;
      bool have = true;
      while (have) {
        CHECK(p.Next(&f, &have).ok());
        if (have) got.push_back(f);
      }
    }
    CHECK(got.size() == 2);
    if (got.size() == 2) {
      std::string v;
      int64_t i = 0;
      CHECK(ParseValue(got[0], &v).ok() && v == "hello");
      CHECK(ParseInt(got[1], &i).ok() && i == -5);
    }
  }
  // An oversized length prefix is refused at once, without waiting for (or
  // allocating) the announced bytes.
  FrameParser p(kMaxHandshakeFrame);
  const uint8_t huge[] = {0xff, 0xff, 0xff, 0xff};
  p.Feed(huge, 4);
  Frame f;
  bool have;
  WireStatus s = p.Next(&f, &have);
  CHECK(s.cause() == WireCause::PROTOCOL_ERROR && Contains(s.message(), "exceeds the maximum"));
  FrameParser z(kMaxFrame);
  const uint8_t zero[] = {0, 0, 0, 0};
  z.Feed(zero, 4);
  CHECK(z.Next(&f, &have).cause() == WireCause::PROTOCOL_ERROR);
  // A field length beyond the payload, and an entry count no body could hold.
  Frame bad;
  bad.type = kValue;
  bad.body = std::string("\x00\x00\x10\x00", 4) + "abc";
  std::string v;
  CHECK(ParseValue(bad, &v).cause() == WireCause::PROTOCOL_ERROR);
  bad.type = kEntries;
  bad.body = std::string("\xff\xff\xff\xff", 4);
  std::vector<std::pair<std::string, std::string>> entries;
  s = ParseEntries(bad, &entries);
  CHECK(s.cause() == WireCause::PROTOCOL_ERROR && Contains(s.message(), "entries"));
  // An ERROR frame becomes its typed cause.
  Frame err;
  err.type = kError;
  err.body = std::string(1, char(1)) + std::string("\x00\x00\x00\x04", 4) + "late";
  s = ParseValue(err, &v);
  CHECK(s.cause() == WireCause::TIMEOUT && s.message() == "late");
  CHECK(s.ToStatus().code() == tfring::StatusCode::ABORTED);
  std::string secret;
  CHECK(DecodeSecretHex("00112233445566778899aabbccddeeff", &secret).ok() &&
        secret.size() == 16);
  CHECK(DecodeSecretHex("0011", &secret).cause() == WireCause::INVALID_ARGUMENT);
  CHECK(DecodeSecretHex("zz112233445566778899aabbccddeeff", &secret).cause() ==
        WireCause::INVALID_ARGUMENT);
  // Proofs differ by direction (no reflection) and by nonce (no replay).
  std::string n1(32, 'a'), n2(32, 'b');
  CHECK(ClientMac(secret, n1, n2, "rendezvous") != ServerMac(secret, n1, n2, "rendezvous"));
  CHECK(ClientMac(secret, n1, n2, "rendezvous") != ClientMac(secret, n2, n2, "rendezvous"));
  CHECK(ClientMac(secret, n1, n2, "rendezvous") != ClientMac(secret, n1, n2, "peer"));
}

static Registration Reg(const std::string& host, int slot, int order) {
  Registration r;
  r.host = host;
  r.pid = 100 + slot;
  r.addr = host + ":" + std::to_string(5000 + slot);
  r.slot = slot;
  r.order = order;
  return r;
}

static void TestTopology() {
  // Three hosts with uneven slots (3, 1, 2), given in a scrambled order.
  std::vector<Registration> regs = {Reg("b", 0, 1), Reg("c", 1, 2), Reg("a", 2, 0),
                                    Reg("a", 0, 0), Reg("c", 0, 2), Reg("a", 1, 0)};
  std::vector<RankInfo> t;
  CHECK(DeriveTopology(regs, &t).ok());
  CHECK(t.size() == 6);
  const char* hosts[] = {"a", "a", "a", "b", "c", "c"};
  int local[] = {0, 1, 2, 0, 0, 1}, lsize[] = {3, 3, 3, 1, 2, 2};
  int cross[] = {0, 0, 0, 1, 2, 1}, csize[] = {3, 2, 1, 3, 3, 2};
  for (int i = 0; i < 6 && t.size() == 6; ++i) {
    CHECK(t[i].rank == i && t[i].reg.host == hosts[i] && t[i].local_rank == local[i] &&
          t[i].local_size == lsize[i] && t[i].cross_rank == cross[i] &&
          t[i].cross_size == csize[i]);
  }
  regs.push_back(Reg("a", 1, 0));
  WireStatus s = DeriveTopology(regs, &t);
  CHECK(s.cause() == WireCause::INVALID_ARGUMENT && Contains(s.message(), "slot(s) [1]"));
  Registration back;
  CHECK(DecodeRegistration(EncodeRegistration(Reg("h", 3, -1)), "k", &back).ok() &&
        back.host == "h" && back.slot == 3 && back.order == -1 && back.addr == "h:5003");
  CHECK(DecodeRegistration("v1\nhost=h\n", "k", &back).cause() == WireCause::INVALID_ARGUMENT);
  CHECK(DecodeRegistration("", "k", &back).cause() == WireCause::INVALID_ARGUMENT);
}

static std::string SecretFromEnv() {
  const char* hex = std::getenv("TFRING_SECRET");
  std::string secret;
  WireStatus s = DecodeSecretHex(hex ? hex : "", &secret);
  if (!s.ok()) {
    std::printf("bad TFRING_SECRET: %s\n", s.message().c_str());
    std::exit(2);
  }
  return secret;
}

static void TestStore(const std::string& host, int port, const std::string& scope, int n) {
  std::string secret = SecretFromEnv();
  RendezvousClient c;
  WireStatus s = c.Connect(host, port, secret, 10.0);
  CHECK(s.ok());
  if (!s.ok()) {
    std::printf("connect: %s\n", s.message().c_str());
    return;
  }
  CHECK(c.Ping().ok());
  CHECK(c.Set(scope, "k", std::string("v\0w", 3)).ok());
  std::string v;
  CHECK(c.Get(scope, "k", 1.0, &v).ok() && v == std::string("v\0w", 3));
  s = c.Set(scope, "k", "again", /*exclusive=*/true);
  CHECK(s.cause() == WireCause::INVALID_ARGUMENT && Contains(s.message(), "already set"));
  int64_t r = 0;
  CHECK(c.Add(scope, "ctr", 5, &r).ok() && r == 5);
  CHECK(c.Add(scope, "ctr", -7, &r).ok() && r == -2);
  s = c.Get(scope, "missing-key", 0.2, &v);
  CHECK(s.cause() == WireCause::TIMEOUT && Contains(s.message(), "'missing-key'"));
  // A timed-out request leaves the connection usable.
  CHECK(c.Wait(scope, {"k", "ctr"}, 1.0).ok());
  s = c.Wait(scope, {"k", "nope"}, 0.2);
  CHECK(s.cause() == WireCause::TIMEOUT && Contains(s.message(), "nope"));
  // Register n fake ranks over 2 hosts and print what this side derives.
  for (int i = 0; i < n; ++i) {
    Registration reg = Reg(i % 2 ? "host-b" : "host-a", i / 2, -1);
    std::string key = "reg/" + reg.host + "/" + std::to_string(reg.slot);
    CHECK(c.Set(scope, key, EncodeRegistration(reg), true).ok());
  }
  std::vector<std::pair<std::string, std::string>> entries;
  CHECK(c.WaitPrefix(scope, "reg/", uint32_t(n), 5.0, &entries).ok());
  std::vector<Registration> regs;
  for (const auto& e : entries) {
    Registration reg;
    CHECK(DecodeRegistration(e.second, e.first, &reg).ok());
    regs.push_back(reg);
  }
  std::vector<RankInfo> topo;
  CHECK(DeriveTopology(regs, &topo).ok());
  for (const RankInfo& t : topo) {
    std::printf("TOPO %d %d %d %d %d %d %s %lld\n", t.rank, t.size, t.local_rank, t.local_size,
                t.cross_rank, t.cross_size, t.reg.host.c_str(), (long long)t.reg.slot);
  }
  CHECK(c.DeleteScope(scope).ok());
  // A deleted scope stays closed: a rank late for a replaced round fails at once.
  s = c.Get(scope, "k", 5.0, &v);
  CHECK(s.cause() == WireCause::SHUTTING_DOWN);
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "unit";
  if (mode == "unit") {
    TestSha256();
    TestParser();
    TestTopology();
  } else if (mode == "store" && argc == 6) {
    TestStore(argv[2], std::atoi(argv[3]), argv[4], std::atoi(argv[5]));
  } else if (mode == "connect" && argc == 5) {
    RendezvousClient c;
    WireStatus s = c.Connect(argv[2], std::atoi(argv[3]), SecretFromEnv(), std::atof(argv[4]));
    if (s.ok()) s = c.Ping();
    std::printf("%s %s\n", WireCauseName(s.cause()), s.message().c_str());
    return 0;
  } else {
    std::printf("usage: tcp_client_test unit | store HOST PORT SCOPE N | connect HOST PORT S\n");
    return 2;
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
