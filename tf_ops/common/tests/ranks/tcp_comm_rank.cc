// One rank of a multi-process job over the TCP communicator
// (transport/tcp/tcp_communicator.*), started by
// tests/common/transport/test_tcp_communicator.py for what only separate
// processes show: the exchanges of tcp_exchange.h between processes, a
// SIGKILLed or SIGSTOPped rank, strangers at a listener, a malformed frame
// from an authenticated peer, and an idle world kept alive by heartbeats.
// (A subfolder of tests/, so Bazel makes no cc_test of it: it needs
// arguments and its peers.)
//   tcp_comm_rank R N DIR SCENARIO [HEARTBEAT_S]
// publishes its listener in DIR/addr.R, reads the others' (secret from
// TFRING_SECRET), runs SCENARIO:
//   exchange   point-to-point and the collectives; prints "RESULT ok"
//   ring       exchanges 1 MiB around a ring until the world fails; prints
//              "READY" once connected, "EXCHANGING" after its first
//              exchange, and "ABORTED <message>" at the end
//   serve      ranks > 0 wait for DIR/go before connecting; then prints
//              "READY", keeps exchanging until DIR/stop exists,
//              checks every message, prints "RESULT ok"
//   pingpong   ranks 0 and 1 bounce 4 KB; prints "PINGPONG <us per round trip>"
//   bandwidth  ranks 0 and 1 swap 64 MiB ten times; prints "BANDWIDTH <GB/s>"
//   idle       sits idle 5 s; prints "IDLECPU <CPU s per s>"
// (pingpong and bandwidth check their data; their speed is printed for the
// record, the targets live in benchmarks/.)
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../../transport/tcp/socket.h"
#include "../../transport/tcp/tcp_communicator.h"
#include "../../transport/tcp/wire.h"
#include "../check.h"
#include "../tcp_exchange.h"

using namespace tfring;
using namespace tfring::tcp;
using namespace tfring::test;

namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

int RankMain(int rank, int n, const std::string& dir, const std::string& scenario, double hb) {
  std::string secret;
  const char* hex = std::getenv("TFRING_SECRET");
  WireStatus ws = DecodeSecretHex(hex ? hex : "", &secret);
  if (!ws.ok()) {
    std::printf("ERROR %s\n", ws.message().c_str());
    return 2;
  }
  std::unique_ptr<TcpListener> l;
  Status s = TcpListener::Open("127.0.0.1", 0, &l);
  if (!s.ok()) {
    std::printf("ERROR %s\n", s.message().c_str());
    return 2;
  }
  {
    std::string tmp = dir + "/.addr." + std::to_string(rank);
    std::ofstream(tmp) << l->address();
    std::rename(tmp.c_str(), (dir + "/addr." + std::to_string(rank)).c_str());
  }
  std::vector<TcpPeer> peers(n);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < n; ++i) {
    while (!ReadFile(dir + "/addr." + std::to_string(i), &peers[i].addr)) {
      if (std::chrono::steady_clock::now() > until) {
        std::printf("ERROR no address from rank %d\n", i);
        return 2;
      }
      Sleep(0.02);
    }
    peers[i].host = "proc-host-" + std::to_string(i);
  }
  // "serve": the other ranks hold back until DIR/go exists, so the test
  // knows rank 0 is in the middle of start-up while strangers knock.
  std::string go;
  while (scenario == "serve" && rank > 0 && !ReadFile(dir + "/go", &go)) {
    if (std::chrono::steady_clock::now() > until) {
      std::printf("ERROR no go\n");
      return 2;
    }
    Sleep(0.02);
  }
  TcpOptions options;
  options.secret = secret;
  options.heartbeat_seconds = hb;
  options.connect_timeout = 60;
  std::shared_ptr<Communicator> world;
  s = ConnectTcpWorld(rank, peers, std::move(l), options, &world);
  if (!s.ok()) {
    std::printf("ERROR %s\n", s.message().c_str());
    return 2;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  if (scenario == "exchange") {
    Exchange(*world);
  } else if (scenario == "ring") {
    const size_t kBytes = 1 << 20;
    std::string out = Pattern(kBytes, rank), in(kBytes, 'x');
    for (int i = 0;; ++i) {
      s = SendRecv(*world, out, (rank + 1) % n, &in, (rank + n - 1) % n, 1);
      if (!s.ok()) break;
      if (i == 0) {
        std::printf("EXCHANGING\n");
        std::fflush(stdout);
      }
    }
    std::printf("ABORTED %s\n", s.message().c_str());
    std::fflush(stdout);
    CHECK(s.code() == StatusCode::ABORTED);
  } else if (scenario == "serve") {
    std::string stop;
    for (int i = 0; !ReadFile(dir + "/stop", &stop); ++i) {
      std::vector<uint64_t> words = {uint64_t(i)};
      CHECK(AllreduceBitsAnd(*world, &words).ok());
      CHECK(words[0] == uint64_t(i));
      std::string b = rank == 0 ? Pattern(5000, i) : std::string();
      CHECK(BroadcastBytes(*world, &b).ok());
      CHECK(b == Pattern(5000, i));
      Sleep(0.02);
    }
    CHECK(BarrierP2P(*world).ok());
  } else if (scenario == "pingpong") {
    const int kIters = 5000;
    std::string buf(4096, 'p');
    CHECK(BarrierP2P(*world).ok());
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters && rank < 2; ++i) {
      if (rank == 0) {
        CommRequestPtr r;
        CHECK(world->Isend(buf.data(), 4096, 1, 2, &r).ok());
        CHECK(world->Wait(r.get(), "ping", true).ok());
        CHECK(world->Irecv(&buf[0], 4096, 1, 2, &r).ok());
        CHECK(world->Wait(r.get(), "pong", true).ok());
      } else {
        CommRequestPtr r;
        CHECK(world->Irecv(&buf[0], 4096, 0, 2, &r).ok());
        CHECK(world->Wait(r.get(), "ping", true).ok());
        CHECK(world->Isend(buf.data(), 4096, 0, 2, &r).ok());
        CHECK(world->Wait(r.get(), "pong", true).ok());
      }
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                    .count() / kIters;
    if (rank == 0) std::printf("PINGPONG %.1f\n", us);
    CHECK(BarrierP2P(*world).ok());
  } else if (scenario == "bandwidth") {
    // Ranks 0 and 1 swap 64 MiB ten times, checking the last exchange.
    const size_t kBytes = 64u << 20;
    std::string out = Pattern(kBytes, rank), in(kBytes, 'x');
    CHECK(BarrierP2P(*world).ok());
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10 && rank < 2; ++i) {
      CHECK(SendRecv(*world, out, 1 - rank, &in, 1 - rank, 3).ok());
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank < 2) CHECK(in == Pattern(kBytes, 1 - rank));
    if (rank == 0) std::printf("BANDWIDTH %.2f GB/s each way\n", 10 * kBytes / s / 1e9);
    CHECK(BarrierP2P(*world).ok());
  } else if (scenario == "idle") {
    // An idle world: only the heartbeat thread runs. Prints the CPU seconds
    // per second this process used meanwhile.
    CHECK(BarrierP2P(*world).ok());
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    auto t0 = std::chrono::steady_clock::now();
    Sleep(5.0);
    getrusage(RUSAGE_SELF, &b);
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto secs = [](const struct timeval& t) { return double(t.tv_sec) + t.tv_usec * 1e-6; };
    double cpu = secs(b.ru_utime) - secs(a.ru_utime) + secs(b.ru_stime) - secs(a.ru_stime);
    std::printf("IDLECPU %.4f\n", cpu / wall);
    CHECK(BarrierP2P(*world).ok());
  } else {
    std::printf("ERROR unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  world.reset();
  if (g_failures == 0) std::printf("RESULT ok\n");
  return CheckExitCode();
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s R N DIR SCENARIO [HEARTBEAT_S]\n", argv[0]);
    return 2;
  }
  return RankMain(std::atoi(argv[1]), std::atoi(argv[2]), argv[3], argv[4],
                  argc > 5 ? std::atof(argv[5]) : 1.0);
}
