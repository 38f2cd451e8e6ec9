// Allreduce through the GPU executor's pipeline and the NCCL data plane (what
// the core runs for a negotiated GPU allreduce, without the negotiation)
// against a raw NCCL loop over the same libnccl.so.2, in the same process, at
// np=1.
// Driven by benchmarks/gpu.py, which builds it and turns its JSON lines into
// a table.
//
//   nccl_gpu_bench [min_mb max_mb iters rounds]
//
// Two modes per size and op, each against two baselines (raw NCCL waited
// for with one stream synchronise, and raw NCCL with a per-collective event,
// which is what any design that completes each collective on its own pays):
//   pipelined: `iters` collectives enqueued back to back, then waited for
//              (raw: one cudaStreamSynchronize; plane: polling every
//              completion, as the background thread does);
//   latency:   each collective waited for before the next is enqueued.
// Rounds alternate raw and plane; the median round is reported.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "../../executor.h"
#include "../../ops/cuda/cuda_nccl_api.h"
#include "../../ops/gpu_executor.h"
#include "../../ops/nccl_data_plane.h"

using namespace tfring;

#define CUDA_OK(expr)                                                                        \
  do {                                                                                       \
    cudaError_t _e = (expr);                                                                 \
    if (_e != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(_e));                \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)
#define NCCL_OK(expr)                                                                        \
  do {                                                                                       \
    ncclResult_t _r = (expr);                                                                \
    if (_r != ncclSuccess) {                                                                 \
      std::fprintf(stderr, "%s failed: %s\n", #expr, ncclGetErrorString(_r));                \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)
#define STATUS_OK(expr)                                                                      \
  do {                                                                                       \
    Status _s = (expr);                                                                      \
    if (!_s.ok()) {                                                                          \
      std::fprintf(stderr, "%s failed: %s\n", #expr, _s.message().c_str());                 \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void WaitAll(std::vector<std::unique_ptr<DeviceEvent>>& done) {
  for (auto& d : done) {
    if (!d) continue;
    for (;;) {
      Status s = d->Query();
      if (s.ok()) break;
      if (!s.in_progress()) {
        std::fprintf(stderr, "poll: %s\n", s.message().c_str());
        std::exit(2);
      }
      std::this_thread::yield();
    }
    d.reset();
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int min_mb = argc > 1 ? std::atoi(argv[1]) : 1;
  const int max_mb = argc > 2 ? std::atoi(argv[2]) : 256;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 100;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;

  CUDA_OK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  std::printf("{\"device\": \"%s\", \"nccl_version\": %d, \"iters\": %d, \"rounds\": %d}\n",
              prop.name, version, iters, rounds);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // The raw baseline: a plain blocking communicator, as a user would make one.
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t raw;
  NCCL_OK(ncclCommInitRank(&raw, 1, id, 0));

  std::unique_ptr<NcclApi> api = CreateCudaNcclApi();
  auto abort = std::make_shared<NcclAbortFlag>();
  NcclCommunicators comms(api.get(), abort);
  NcclDataPlane plane(&comms, 0, 0, 1, [](std::string*) { return Status::OK(); });
  GpuShared shared;
  shared.api = api.get();
  shared.comms = &comms;
  shared.events = std::make_shared<GpuEventPool>(api.get());
  std::unique_ptr<Executor> executor;
  STATUS_OK(GpuExecutor::Create(&shared, 0, &executor));
  plane.Bind(executor->context());
  auto no_phase = [](const std::string&, Clock::time_point) {};

  const size_t max_bytes = static_cast<size_t>(max_mb) << 20;
  void *send = nullptr, *recv = nullptr;
  CUDA_OK(cudaMalloc(&send, max_bytes));
  CUDA_OK(cudaMalloc(&recv, max_bytes));
  CUDA_OK(cudaMemset(send, 0, max_bytes));
  std::vector<cudaEvent_t> events(iters);
  for (auto& e : events) CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  struct OpCase {
    const char* name;
    ReduceOp plane_op;
    ncclRedOp_t raw_op;
  };
  // Average: the plane sums with NCCL and divides with its own kernel; raw
  // NCCL has ncclAvg built in.
  const OpCase cases[] = {{"sum", ReduceOp::SUM, ncclSum}, {"average", ReduceOp::AVERAGE, ncclAvg}};

  for (int mb = min_mb; mb <= max_mb; mb *= 2) {
    const size_t bytes = static_cast<size_t>(mb) << 20;
    const size_t count = bytes / sizeof(float);
    for (const OpCase& c : cases) {
      for (int pipelined = 1; pipelined >= 0; --pipelined) {
        // Host time to enqueue (per op) is recorded too: at np=1 and small
        // sizes it, not the GPU, bounds the pipelined rate.
        double enqueue_s = 0;
        auto raw_loop = [&] {
          auto t0 = Clock::now();
          for (int i = 0; i < iters; ++i) {
            NCCL_OK(ncclAllReduce(send, recv, count, ncclFloat32, c.raw_op, raw, stream));
            if (!pipelined) CUDA_OK(cudaStreamSynchronize(stream));
          }
          enqueue_s = Seconds(t0, Clock::now());
          CUDA_OK(cudaStreamSynchronize(stream));
        };
        // Raw NCCL plus what any per-collective completion costs: an event
        // recorded after each collective and polled until it is done.
        auto raw_events_loop = [&] {
          for (int i = 0; i < iters; ++i) {
            NCCL_OK(ncclAllReduce(send, recv, count, ncclFloat32, c.raw_op, raw, stream));
            CUDA_OK(cudaEventRecord(events[i], stream));
            if (!pipelined) {
              while (cudaEventQuery(events[i]) == cudaErrorNotReady) std::this_thread::yield();
            }
          }
          for (int i = 0; i < iters; ++i) {
            while (cudaEventQuery(events[i]) == cudaErrorNotReady) std::this_thread::yield();
          }
        };
        std::vector<std::unique_ptr<DeviceEvent>> done(iters);
        auto plane_loop = [&] {
          auto t0 = Clock::now();
          for (int i = 0; i < iters; ++i) {
            RunResult run = RunAllreduce(*executor, plane,
                                         {{send, recv, static_cast<int64_t>(count)}},
                                         DataType::FLOAT32, c.plane_op, 1.0, 1.0, 1, no_phase);
            if (!run.status.ok() && !run.status.in_progress()) STATUS_OK(run.status);
            done[i] = std::move(run.pending);
            if (!pipelined) {
              std::vector<std::unique_ptr<DeviceEvent>> one;
              one.push_back(std::move(done[i]));
              WaitAll(one);
            }
          }
          enqueue_s = Seconds(t0, Clock::now());
          WaitAll(done);
        };
        raw_loop();  // warm-up (also fills the plane's event pool below)
        raw_events_loop();
        plane_loop();
        std::vector<double> raw_t, raw_ev_t, plane_t, raw_enq, plane_enq;
        for (int r = 0; r < rounds; ++r) {
          auto t0 = Clock::now();
          raw_loop();
          auto t1 = Clock::now();
          raw_enq.push_back(enqueue_s / iters);
          plane_loop();
          auto t2 = Clock::now();
          plane_enq.push_back(enqueue_s / iters);
          raw_events_loop();
          auto t3 = Clock::now();
          raw_t.push_back(Seconds(t0, t1) / iters);
          plane_t.push_back(Seconds(t1, t2) / iters);
          raw_ev_t.push_back(Seconds(t2, t3) / iters);
        }
        const double rt = Median(raw_t), pt = Median(plane_t), et = Median(raw_ev_t);
        std::printf(
            "{\"bytes\": %zu, \"op\": \"%s\", \"mode\": \"%s\", \"raw_us\": %.3f, "
            "\"raw_events_us\": %.3f, \"plane_us\": %.3f, \"raw_enqueue_us\": %.3f, "
            "\"plane_enqueue_us\": %.3f, \"raw_algbw_gbs\": %.2f, \"plane_algbw_gbs\": %.2f, "
            "\"ratio\": %.4f, \"ratio_vs_raw_events\": %.4f, \"in_progress_waits\": %lld}\n",
            bytes, c.name, pipelined ? "pipelined" : "latency", rt * 1e6, et * 1e6, pt * 1e6,
            Median(raw_enq) * 1e6, Median(plane_enq) * 1e6, bytes / rt / 1e9, bytes / pt / 1e9,
            rt / pt, et / pt, static_cast<long long>(plane.in_progress_waits()));
        std::fflush(stdout);
      }
    }
  }
  for (auto& e : events) cudaEventDestroy(e);
  cudaFree(send);
  cudaFree(recv);
  ncclCommDestroy(raw);
  cudaStreamDestroy(stream);
  return 0;
}
