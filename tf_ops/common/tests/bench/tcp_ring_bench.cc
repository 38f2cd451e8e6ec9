// The ring data plane over the TCP communicator, without TensorFlow, MPI or
// the core's negotiation: what the transport alone costs (a subfolder of
// tests/, so Bazel makes no cc_test of it). Run by
// `python benchmarks/transport.py --cpp-ring` (which builds it with -O2 and
// starts one rank per fake host); by hand:
//   tcp_ring_bench RANK SIZE DIR BIND_HOST BYTES REPS [MODE]
// Each rank publishes its listener's address in DIR/addr.RANK, reads the
// others', connects the world (secret from TFRING_SECRET), runs REPS float32
// sum allreduces of BYTES (after two warm-ups), checks the result and prints
//   RANK r median_ms M busbw_gbs B cpu_ms_per_op C
// where C is this process's CPU time (user + system) per allreduce.
// MODE "negotiate" instead times the TCP controller's negotiation round
// (backends/p2p_controller.h): REPS rounds of the cache-bit allreduce
// (BYTES/8 words) alone ("bits") and of a cache miss (the bits, then a
// gather of BYTES to rank 0 and its broadcast back), waits urgent as in a
// training step, and prints
//   NEGOTIATE r bits_median_us M bits_p90_us P miss_median_us M2 miss_p90_us P2 cpu_us_per_round C
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

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

// Rounds of the negotiation's collectives, back to back after a short
// pause (the ranks leave each round at different times, as after a step).
Status Negotiate(Communicator& world, int rank, long long bytes, int reps) {
  SetUrgentWaits(true);
  std::vector<uint64_t> words(size_t(std::max(1LL, bytes / 8)));
  const std::string mine(size_t(std::max(1LL, bytes)), char('a' + rank));
  std::vector<double> bits, miss;
  double cpu = 0;
  for (int i = 0; i < reps + 10; ++i) {
    TFRING_RETURN_IF_ERROR(BarrierP2P(world));
    const double c0 = CpuSeconds();
    auto t0 = std::chrono::steady_clock::now();
    std::fill(words.begin(), words.end(), ~uint64_t{0});
    TFRING_RETURN_IF_ERROR(AllreduceBitsAnd(world, &words));
    const double t_bits =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    TFRING_RETURN_IF_ERROR(BarrierP2P(world));
    t0 = std::chrono::steady_clock::now();
    TFRING_RETURN_IF_ERROR(AllreduceBitsAnd(world, &words));
    std::vector<std::string> all;
    TFRING_RETURN_IF_ERROR(GatherBytes(world, mine, &all));
    std::string reply = rank == 0 ? all.back() : std::string();
    TFRING_RETURN_IF_ERROR(BroadcastBytes(world, &reply));
    const double t_miss =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (words[0] != ~uint64_t{0} || reply.size() != mine.size()) {
      return Status::Aborted("wrong negotiation result");
    }
    if (i >= 10) {
      bits.push_back(t_bits * 1e6);
      miss.push_back(t_miss * 1e6);
      cpu += CpuSeconds() - c0;
    }
  }
  std::printf(
      "NEGOTIATE %d bits_median_us %.1f bits_p90_us %.1f miss_median_us %.1f miss_p90_us %.1f "
      "cpu_us_per_round %.1f\n",
      rank, Percentile(bits, 0.5), Percentile(bits, 0.9), Percentile(miss, 0.5),
      Percentile(miss, 0.9), cpu * 1e6 / reps);
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7 && argc != 8) {
    return Fail("usage: tcp_ring_bench RANK SIZE DIR BIND_HOST BYTES REPS [ring|negotiate]");
  }
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
    // The pid first: a rank that reads another's address finds its pid too.
    std::ofstream(dir + "/pid." + std::to_string(rank)) << getpid();
    const std::string tmp = dir + "/.addr." + std::to_string(rank);
    std::ofstream(tmp) << listener->address();
    std::rename(tmp.c_str(), (dir + "/addr." + std::to_string(rank)).c_str());
  }
  std::vector<TcpPeer> peers(static_cast<size_t>(n));
  // The ranks run on this machine (fake hosts share its CPUs): watched and
  // counted as the core's peer monitor does, so the waits decide as in a job.
  std::vector<PeerMonitor::Peer> local;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < n; ++i) {
    while (!ReadFile(dir + "/addr." + std::to_string(i), &peers[size_t(i)].addr)) {
      if (std::chrono::steady_clock::now() > until) return Fail("no address from a rank");
      usleep(20000);
    }
    peers[size_t(i)].host = "bench-host-" + std::to_string(i);
    std::string pid;
    if (ReadFile(dir + "/pid." + std::to_string(i), &pid)) {
      local.push_back({i, std::atoi(pid.c_str()), "this-machine"});
    }
  }
  TcpOptions options;
  options.secret = secret;
  std::shared_ptr<Communicator> world;
  s = ConnectTcpWorld(rank, peers, std::move(listener), options, &world);
  if (!s.ok()) return Fail(s.message());
  world->set_monitor(std::make_shared<PeerMonitor>(rank, "this-machine", local));
  if (argc == 8 && std::string(argv[7]) == "negotiate") {
    s = Negotiate(*world, rank, bytes, reps);
    if (s.ok()) s = BarrierP2P(*world);
    world.reset();
    return s.ok() ? 0 : Fail(s.message());
  }
  std::unique_ptr<DataPlane> plane;
  // TFRING_BENCH_SEGMENT / TFRING_BENCH_WINDOW: the ring's piece size and
  // receive window, for sweeps (0 or unset: the plane's defaults).
  ring_internal::RingOptions ring_options;
  if (const char* v = std::getenv("TFRING_BENCH_SEGMENT")) ring_options.segment_bytes = std::atoll(v);
  if (const char* v = std::getenv("TFRING_BENCH_WINDOW")) ring_options.window = std::atoi(v);
  s = ring_internal::CreateRingDataPlane(world, true, ring_options, &plane);
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
