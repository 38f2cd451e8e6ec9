// The ring data plane over the TCP communicator, without TensorFlow, MPI or
// the core's negotiation: what the transport alone costs (a subfolder of
// tests/, so Bazel makes no cc_test of it). Run by
// `python benchmarks/transport.py --cpp-ring` (which builds it with -O2 and
// starts one rank per fake host); by hand:
//   tcp_ring_bench RANK SIZE DIR BIND_HOST BYTES REPS
// Each rank publishes its listener's address in DIR/addr.RANK, reads the
// others', connects the world (secret from TFRING_SECRET), runs REPS float32
// sum allreduces of BYTES (after two warm-ups), checks the result and prints
//   RANK r median_ms M busbw_gbs B cpu_ms_per_op C
// where C is this process's CPU time (user + system) per allreduce.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../../ops/ring_data_plane.h"
#include "../../transport/tcp/tcp_communicator.h"
#include "../../transport/tcp/wire.h"

using namespace tfring;
using namespace tfring::tcp;

namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return !out->empty();
}

double CpuSeconds() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int Fail(const std::string& what) {
  std::printf("ERROR %s\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) return Fail("usage: tcp_ring_bench RANK SIZE DIR BIND_HOST BYTES REPS");
  const int rank = std::atoi(argv[1]), n = std::atoi(argv[2]);
  const std::string dir = argv[3], bind = argv[4];
  const long long bytes = std::atoll(argv[5]);
  const int reps = std::max(1, std::atoi(argv[6]));
  std::string secret;
  const char* hex = std::getenv("TFRING_SECRET");
  if (!DecodeSecretHex(hex ? hex : "", &secret).ok()) return Fail("TFRING_SECRET is not set");
  std::unique_ptr<TcpListener> listener;
  Status s = TcpListener::Open(bind, 0, &listener);
  if (!s.ok()) return Fail(s.message());
  {
    const std::string tmp = dir + "/.addr." + std::to_string(rank);
    std::ofstream(tmp) << listener->address();
    std::rename(tmp.c_str(), (dir + "/addr." + std::to_string(rank)).c_str());
  }
  std::vector<TcpPeer> peers(static_cast<size_t>(n));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < n; ++i) {
    while (!ReadFile(dir + "/addr." + std::to_string(i), &peers[size_t(i)].addr)) {
      if (std::chrono::steady_clock::now() > until) return Fail("no address from a rank");
      usleep(20000);
    }
    peers[size_t(i)].host = "bench-host-" + std::to_string(i);
  }
  TcpOptions options;
  options.secret = secret;
  std::shared_ptr<Communicator> world;
  s = ConnectTcpWorld(rank, peers, std::move(listener), options, &world);
  if (!s.ok()) return Fail(s.message());
  std::unique_ptr<DataPlane> plane;
  s = ring_internal::CreateRingDataPlane(world, true, ring_internal::RingOptions(), &plane);
  if (!s.ok()) return Fail(s.message());
  std::vector<float> buf(static_cast<size_t>(bytes / 4));
  std::vector<double> times;
  double cpu = 0;
  for (int i = 0; i < reps + 2; ++i) {
    std::fill(buf.begin(), buf.end(), 1.0f);
    const double c0 = CpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    s = plane->Allreduce(buf.data(), int64_t(buf.size()), DataType::FLOAT32, ReduceOp::SUM);
    if (!s.ok()) return Fail(s.message());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (buf.front() != float(n) || buf.back() != float(n)) return Fail("wrong allreduce result");
    if (i >= 2) {
      times.push_back(dt);
      cpu += CpuSeconds() - c0;
    }
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::printf("RANK %d median_ms %.3f busbw_gbs %.3f cpu_ms_per_op %.2f\n", rank, median * 1e3,
              double(bytes) / median * 2.0 * (n - 1) / n / 1e9, cpu * 1e3 / reps);
  s = BarrierP2P(*world);
  plane.reset();
  world.reset();
  return s.ok() ? 0 : Fail(s.message());
}
