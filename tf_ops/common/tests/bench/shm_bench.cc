// The shared-memory data plane's bench (ops/shm_data_plane.*), without MPI
// or TensorFlow: forked ranks (../shm_job.h) time one collective by size,
// median and minimum, bus bandwidth as nccl-tests counts it, and rank 0's
// CPU time. Run by benchmarks/shm_rank_order.py (a subfolder of tests/, so
// Bazel makes no cc_test of it); by hand:
//   shm_bench --np N [--chunk B] [--small B] [--spin NS] [--bytes B]... [--pin]
//             [--skew US]                  the last rank starts each collective late
//             [--single-copy] [--single-copy-min B]
//             [--compare]                  alternate with a staged-only plane
//             [--collective C]             time C by size: allreduce (float32 Sum,
//                                          the default), allreduce-inplace,
//                                          reducescatter, broadcast,
//                                          broadcast-inplace, allgather, or memcpy
//                                          (the floor)
//             [--timeout S]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../ops/shm_data_plane.h"
#include "../shm_job.h"

using namespace tfring;
using namespace tfring::test;

namespace {

double g_skew_us = 0;

int RunBench(Bus* bus, int rank, int size, const ShmOptions& opts,
             const std::vector<int64_t>& sizes, const std::string& collective, bool compare) {
  FakeBootstrap boot(bus, rank, size);
  // With --compare, a second plane with single copy off runs every
  // other iteration, so both see the same machine (it may be busy).
  std::vector<std::unique_ptr<DataPlane>> planes(compare ? 2 : 1);
  for (size_t v = 0; v < planes.size(); ++v) {
    ShmOptions o = opts;
    if (v == 1) o.single_copy = false;
    Status s = MakePlane(boot, MakeMonitor(bus, rank, size), rank, size, o, &planes[v]);
    if (!s.ok()) {
      std::fprintf(stderr, "plane: %s\n", s.message().c_str());
      return 1;
    }
  }
  for (int64_t bytes : sizes) {
    const int64_t n = bytes / 4;
    std::vector<float> buf(n, 1.0f);
    // Out of place, as the TF ops call them: a separate (warm) output. Sizes
    // follow nccl-tests: an allgather's `bytes` is its whole output.
    std::vector<float> out(n, 0.0f);
    const int64_t share = n / size * 4;
    const std::vector<int64_t> shares(size, share);
    auto run = [&](DataPlane* plane) -> Status {
      if (collective == "broadcast") return plane->BroadcastOutOfPlace(buf.data(), out.data(), bytes, 0);
      if (collective == "broadcast-inplace") {  // the root copies first, as before the fused path
        if (rank == 0) std::memcpy(out.data(), buf.data(), bytes);
        return plane->Broadcast(out.data(), bytes, 0);
      }
      if (collective == "allgather") return plane->Allgather(buf.data(), out.data(), shares);
      // In place (as after a prescale or a fusion copy); `out` holds zeros,
      // so its sums stay put however often it runs.
      if (collective == "allreduce-inplace") {
        return plane->Allreduce(out.data(), n, DataType::FLOAT32, ReduceOp::SUM);
      }
      if (collective == "reducescatter") {  // `bytes` is the whole input
        return plane->Reducescatter(buf.data(), out.data(), std::vector<int64_t>(size, n / size),
                                    DataType::FLOAT32, ReduceOp::SUM);
      }
      if (collective == "memcpy") {  // the floor: one copy of the message by every rank
        std::memcpy(out.data(), buf.data(), bytes);
        return Status::OK();
      }
      return plane->Allreduce(buf.data(), out.data(), n, DataType::FLOAT32, ReduceOp::SUM);
    };
    const int iters = bytes <= (1 << 20) ? 200 : (bytes <= (16 << 20) ? 20 : 8);
    std::vector<std::vector<double>> times(planes.size()), cpu(planes.size());
    for (int i = 0; i < iters + 2; ++i) {
      for (size_t v = 0; v < planes.size(); ++v) {
        boot.Barrier();
        const double c0 = CpuNow(), t0 = Now();
        // The last rank arrives late, as after a real negotiation.
        if (g_skew_us > 0 && rank == size - 1) {
          while (Now() - t0 < g_skew_us * 1e-6) {
          }
        }
        Status s = run(planes[v].get());
        const double t1 = Now(), c1 = CpuNow();
        if (!s.ok()) {
          std::fprintf(stderr, "%s: %s\n", collective.c_str(), s.message().c_str());
          return 1;
        }
        if (i >= 2) {
          times[v].push_back(t1 - t0);
          cpu[v].push_back(c1 - c0);
        }
      }
    }
    for (size_t v = 0; v < planes.size(); ++v) {
      std::sort(times[v].begin(), times[v].end());
      std::sort(cpu[v].begin(), cpu[v].end());
      const double med = times[v][times[v].size() / 2];
      // nccl-tests' bus bandwidth factors (a memcpy counts as a broadcast).
      const bool allreduce = collective.compare(0, 9, "allreduce") == 0;
      const double factor = allreduce                       ? 2.0 * (size - 1) / size
                            : collective == "allgather" ||
                                      collective == "reducescatter" ? 1.0 * (size - 1) / size
                                                                    : 1.0;
      const double busbw = factor * bytes / med / 1e9;
      // CPU time includes busy-polling, so it reads as "work + waiting" when
      // ranks have a core each; on a loaded machine it is the better guide.
      const char* path = !compare ? "" : (v == 0 ? " [as configured]" : " [staged]");
      if (rank == 0)
        std::printf("np=%d %s%s %9lld bytes: median %9.1f us (min %9.1f)  busbw %6.2f "
                    "GB/s  rank-0 CPU %9.1f us\n",
                    size, collective.c_str(), path, (long long)bytes, med * 1e6, times[v][0] * 1e6,
                    busbw, cpu[v][cpu[v].size() / 2] * 1e6);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  JobArgs args;
  ShmOptions opts;
  std::vector<int64_t> sizes;
  std::string collective = "allreduce";
  bool compare = false, pin = false;
  const bool parsed = ParseJobArgs(argc, argv, &args, [&](const std::string& a,
                                                        const std::function<const char*()>& next) {
    if (a == "--pin") pin = true;
    else if (a == "--skew") g_skew_us = std::atof(next());
    else if (a == "--chunk") opts.chunk_bytes = std::atoll(next());
    else if (a == "--small") opts.small_allreduce_bytes = std::atoll(next());
    else if (a == "--spin") opts.spin_ns = std::atoll(next());
    else if (a == "--bytes") sizes.push_back(std::atoll(next()));
    else if (a == "--collective") collective = next();
    else if (a == "--single-copy") opts.single_copy = true;
    else if (a == "--compare") compare = true;
    else if (a == "--single-copy-min") opts.single_copy_min_bytes = std::atoll(next());
    else return false;
    return true;
  });
  if (!parsed) return 2;
  if (sizes.empty()) sizes = {4LL << 10, 64LL << 10, 1LL << 20, 16LL << 20, 64LL << 20};
  int failed = 0;
  for (int size : args.sizes) {
    failed += RunJob(size, args.timeout, [&](Bus* b, int r, int n) {
      return RunBench(b, r, n, opts, sizes, collective, compare);
    }, false, pin);
  }
  return failed == 0 ? 0 : 1;
}
