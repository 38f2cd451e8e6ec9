// Fuzz target for the TCP wire's parser: arbitrary bytes go through the
// incremental frame parser in arbitrary pieces, and every frame through every
// message parser and the registration/topology code. It must never crash,
// read out of bounds (ASan) or allocate beyond the frame limit.
//
// With libFuzzer:  clang++ -fsanitize=fuzzer,address,undefined ... fuzz_wire.cc
// Without it (-DTFRING_SEEDED_DRIVER): a seeded mutation driver,
//   fuzz_wire SEED ITERATIONS [SECONDS]
// mutates a corpus of valid frames and prints "executions N crashes 0".
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "../../transport/tcp/topology.h"
#include "../../transport/tcp/wire.h"

using namespace tfring::tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // First byte: which limit applies (handshake or authenticated) and how the
  // rest is cut into reads.
  uint8_t ctl = data[0];
  ++data;
  --size;
  FrameParser parser((ctl & 1) ? kMaxHandshakeFrame : kMaxFrame);
  size_t step = 1 + (ctl >> 1);
  std::vector<Registration> regs;
  for (size_t off = 0; off < size;) {
    size_t n = std::min(step, size - off);
    // Wanted() must always ask for at least one byte, or a reader would spin.
    if (parser.Wanted() == 0) __builtin_trap();
    parser.Feed(data + off, n);
    off += n;
    for (;;) {
      Frame f;
      bool have = false;
      if (!parser.Next(&f, &have).ok()) return 0;  // the stream is dead, as a reader would close it
      if (!have) break;
      if (f.body.size() + 1 > kMaxFrame) __builtin_trap();
      Challenge ch;
      Auth au;
      ErrorReply er;
      std::string s;
      int64_t i;
      std::vector<std::pair<std::string, std::string>> entries;
      ParseChallenge(f, &ch);
      ParseAuth(f, &au);
      ParseAuthOk(f, &s);
      ParseError(f, &er);
      ParseValue(f, &s);
      ParseInt(f, &i);
      UnexpectedReply(f, kOk);
      if (ParseEntries(f, &entries).ok()) {
        for (const auto& e : entries) {
          Registration r;
          if (DecodeRegistration(e.second, e.first, &r).ok()) regs.push_back(r);
        }
      }
      Registration r;
      if (DecodeRegistration(f.body, "fuzz", &r).ok()) regs.push_back(r);
    }
  }
  std::vector<RankInfo> topo;
  if (!regs.empty() && DeriveTopology(regs, &topo).ok() && topo.size() != regs.size()) {
    __builtin_trap();
  }
  return 0;
}

#ifdef TFRING_SEEDED_DRIVER
#include "seeded_driver.h"

static std::vector<std::string> Seeds() {
  Registration reg;
  reg.host = "h";
  reg.addr = "h:1";
  std::string rec = EncodeRegistration(reg);
  return {
      std::string(1, '\x00') + Writer(kValue).Bytes("hello").Frame() + Writer(kInt).I64(7).Frame(),
      std::string(1, '\x01') +
          Writer(kChallenge).Raw("TFRG").U8(1).Raw(std::string(32, 'n')).Frame(),
      std::string(1, '\x01') + Writer(kAuth).Raw(std::string(32, 'c')).Bytes("rendezvous")
                                   .Raw(std::string(32, 'm')).Frame(),
      std::string(1, '\x06') + Writer(kEntries).U32(2).Bytes("reg/h/0").Bytes(rec)
                                   .Bytes("reg/h/1").Bytes(rec).Frame(),
      std::string(1, '\x10') + Writer(kError).U8(1).Bytes("timed out").Frame() + rec,
  };
}

static void Mutate(std::string* s, std::mt19937_64& rng) {
  int rounds = 1 + int(rng() % 4);
  for (int k = 0; k < rounds; ++k) {
    size_t n = s->size();
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (n) (*s)[rng() % n] ^= char(1 << (rng() % 8));
        break;
      case 1:  // random byte
        if (n) (*s)[rng() % n] = char(rng());
        break;
      case 2:  // insert random bytes
        s->insert(n ? rng() % n : 0, std::string(1 + rng() % 8, char(rng())));
        break;
      case 3:  // delete a range (truncation)
        if (n > 1) {
          size_t a = rng() % n;
          s->erase(a, 1 + rng() % (n - a));
        }
        break;
      case 4: {  // overwrite 4 bytes with an interesting length
        static const uint32_t kLens[] = {0, 1, 255, 256, 257, 1u << 20, (1u << 20) + 1,
                                         0x7fffffff, 0xffffffff};
        uint32_t v = kLens[rng() % 9];
        if (n >= 4) {
          size_t a = rng() % (n - 3);
          for (int i = 0; i < 4; ++i) (*s)[a + i] = char(v >> (24 - 8 * i));
        }
        break;
      }
      case 5:  // duplicate a chunk
        if (n) {
          size_t a = rng() % n;
          s->insert(rng() % n, s->substr(a, 1 + rng() % 32));
        }
        break;
      default:  // pure random input
        *s = std::string(rng() % 64, '\0');
        for (char& c : *s) c = char(rng());
    }
    if (s->size() > 4096) s->resize(4096);
  }
}

int main(int argc, char** argv) { return RunSeededDriver(argc, argv, Seeds(), Mutate); }
#endif
