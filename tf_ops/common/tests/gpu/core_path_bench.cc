// Allreduce through the whole core, driven from C++ the way the TensorFlow
// kernels drive it (their kernels.cc): every allreduce is a
// TensorTableEntry handed to Enqueue, with a ready event recorded on the
// framework's stream, and it ends in its callback. Between the two: the
// queue, the background thread, negotiation (the response cache), fusion,
// the executor and the data plane. Compared in the same process, in
// alternating rounds, with the least the same work can cost: raw NCCL on the
// same libnccl in a GPU build, a memcpy (all an allreduce is at np=1) in a
// CPU build. Built by benchmarks/gpu.py with tfring.build.core_module.
// build_program and run under `tfringrun -np 1 --tcp`, which gives the core
// its controller.
//
//   core_path_bench [min_bytes max_bytes iters rounds]
//
// Modes, per size, each on the same buffers for both sides:
//   latency:   each allreduce waited for before the next is submitted;
//   pipelined: `iters` allreduces submitted back to back, then waited for
//              (the core may fuse them, as it would a model's gradients).
// Prints one JSON line of metadata, then one per size and mode; the median
// round is reported.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../gpu_support.h"
#include "../../operations.h"
#include "../../tensor_queue.h"
#include "../../transport/registry.h"

#ifdef TFRING_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

using namespace tfring;

namespace {

using Clock = std::chrono::steady_clock;

// Exits at once: static destructors must not race the core's threads.
[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "core_path_bench: %s\n", what.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(2);
}

void Ok(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.message());
}

#ifdef TFRING_WITH_NCCL
void CudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}
void NcclOk(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) Die(std::string(what) + ": " + ncclGetErrorString(r));
}
#endif

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Where the tensors live, and the baseline for the same work.
class Device {
 public:
  Device() {
#ifdef TFRING_WITH_NCCL
    CudaOk(cudaSetDevice(0), "cudaSetDevice");
    cudaDeviceProp prop;
    CudaOk(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    name_ = prop.name;
    // The framework's compute stream, which produces the inputs.
    CudaOk(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    ncclUniqueId id;
    NcclOk(ncclGetUniqueId(&id), "ncclGetUniqueId");
    NcclOk(ncclCommInitRank(&raw_, 1, id, 0), "ncclCommInitRank");
    NcclOk(ncclGetVersion(&nccl_version_), "ncclGetVersion");
#endif
  }
  ~Device() {
#ifdef TFRING_WITH_NCCL
    ncclCommDestroy(raw_);
    cudaStreamDestroy(stream_);
#endif
  }
  int32_t id() const { return gpu() ? 0 : kCpuDevice; }
  bool gpu() const {
#ifdef TFRING_WITH_NCCL
    return true;
#else
    return false;
#endif
  }
  std::string name() const { return name_; }
  int nccl_version() const { return nccl_version_; }

  void* Alloc(size_t bytes) {
    void* p = nullptr;
#ifdef TFRING_WITH_NCCL
    CudaOk(cudaMalloc(&p, bytes), "cudaMalloc");
#else
    p = std::malloc(bytes);
    if (p == nullptr) Die("out of memory");
#endif
    return p;
  }
  void Free(void* p) {
#ifdef TFRING_WITH_NCCL
    cudaFree(p);
#else
    std::free(p);
#endif
  }
  void Write(void* dst, const std::vector<float>& values) {
#ifdef TFRING_WITH_NCCL
    CudaOk(cudaMemcpy(dst, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice),
           "cudaMemcpy");
#else
    std::memcpy(dst, values.data(), values.size() * sizeof(float));
#endif
  }
  std::vector<float> Read(const void* src, size_t n) {
    std::vector<float> out(n);
#ifdef TFRING_WITH_NCCL
    CudaOk(cudaMemcpy(out.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
#else
    std::memcpy(out.data(), src, n * sizeof(float));
#endif
    return out;
  }
  // The ready event a framework kernel records for its input (none on a host).
  std::shared_ptr<DeviceEvent> Ready() {
    std::shared_ptr<DeviceEvent> ev;
    if (gpu()) Ok(RecordReadyEvent(0, stream(), &ev), "RecordReadyEvent");
    return ev;
  }
  // The baseline: one allreduce of `count` floats, waited for when `wait`.
  void Raw(const void* send, void* recv, size_t count, bool wait) {
#ifdef TFRING_WITH_NCCL
    NcclOk(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, raw_, stream_), "ncclAllReduce");
    if (wait) CudaOk(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
#else
    (void)wait;
    std::memcpy(recv, send, count * sizeof(float));
#endif
  }
  void RawWait() {
#ifdef TFRING_WITH_NCCL
    CudaOk(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
#endif
  }

 private:
  void* stream() const {
#ifdef TFRING_WITH_NCCL
    return stream_;
#else
    return nullptr;
#endif
  }
  std::string name_ = "host memory";
  int nccl_version_ = 0;
#ifdef TFRING_WITH_NCCL
  cudaStream_t stream_ = nullptr;
  ncclComm_t raw_ = nullptr;
#endif
};

// Counts the callbacks of submitted allreduces; the first error ends the run.
class Completions {
 public:
  DoneCallback Callback() {
    return [this](const Status& s, int32_t) {
      last_callback_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.empty()) error_ = s.message();
      }
      done_.fetch_add(1, std::memory_order_release);
    };
  }
  // When the latest callback ran.
  Clock::time_point last_callback() const {
    return Clock::time_point(Clock::duration(last_callback_ns_.load(std::memory_order_relaxed)));
  }
  // Waits, as a framework's thread would, until `n` have ended in all.
  void WaitFor(int64_t n) {
    while (done_.load(std::memory_order_acquire) < n) std::this_thread::yield();
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) Die("an allreduce failed: " + error_);
  }
  int64_t done() const { return done_.load(std::memory_order_acquire); }

 private:
  std::atomic<int64_t> done_{0};
  std::atomic<Clock::rep> last_callback_ns_{0};
  std::mutex mu_;
  std::string error_;
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t min_bytes = argc > 1 ? std::atoll(argv[1]) : (1 << 20);
  const int64_t max_bytes = argc > 2 ? std::atoll(argv[2]) : (256 << 20);
  const int iters = argc > 3 ? std::atoi(argv[3]) : 100;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  // CORE_PATH_BENCH_NO_READY=1 leaves out the ready events, to show what
  // they cost (the inputs are then assumed written, which here they are).
  const char* no_ready = std::getenv("CORE_PATH_BENCH_NO_READY");
  const bool with_ready_events = no_ready == nullptr || std::string(no_ready) != "1";
  Ok(StartTransport("tcp", TransportArgs()), "starting tfring over TCP");
  if (Size() != 1) Die("run at np=1 (the baseline is a single-rank allreduce)");
  Device device;
  std::printf("{\"device\": \"%s\", \"gpu\": %s, \"nccl_version\": %d, \"iters\": %d, "
              "\"rounds\": %d}\n",
              device.name().c_str(), device.gpu() ? "true" : "false", device.nccl_version(),
              iters, rounds);
  std::fflush(stdout);
  Completions completions;
  int64_t submitted = 0;

  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const size_t count = std::max<size_t>(1, static_cast<size_t>(bytes) / sizeof(float));
    // Distinct buffers for the allreduces that may run together, within
    // 1 GiB a side; both sides cycle through them in the same order.
    const int pairs = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(iters, (int64_t{1} << 30) / bytes)));
    std::vector<void*> send(pairs), recv(pairs);
    std::vector<float> head(std::min<size_t>(count, 4));
    for (int k = 0; k < pairs; ++k) {
      send[k] = device.Alloc(count * sizeof(float));
      recv[k] = device.Alloc(count * sizeof(float));
      for (size_t j = 0; j < head.size(); ++j) head[j] = static_cast<float>(k * 7 + j + 1);
      device.Write(send[k], head);
    }
    for (int pipelined = 0; pipelined <= 1; ++pipelined) {
      const char* mode = pipelined ? "pipelined" : "latency";
      auto raw_loop = [&] {
        for (int i = 0; i < iters; ++i) device.Raw(send[i % pairs], recv[i % pairs], count, !pipelined);
        device.RawWait();
      };
      // Latency mode, per collective: in Enqueue (the ready event included),
      // from Enqueue's return to the callback, from the callback to the
      // waiting caller (negative when the callback ran before Enqueue returned).
      std::vector<double> enqueue_t, to_callback_t, to_caller_t;
      // Pipelined mode: the submitting loop alone, per collective.
      std::vector<double> submit_t;
      auto core_loop = [&] {
        const auto first = Clock::now();
        for (int i = 0; i < iters; ++i) {
          const auto submit = Clock::now();
          TensorTableEntry e;
          e.type = CollectiveType::ALLREDUCE;
          e.name = pipelined ? "pipe." + std::to_string(i) : std::string("latency");
          e.dtype = DataType::FLOAT32;
          e.shape = {static_cast<int64_t>(count)};
          e.device = device.id();
          e.reduce_op = ReduceOp::SUM;
          e.input = send[i % pairs];
          e.output = recv[i % pairs];
          if (with_ready_events) e.ready_event = device.Ready();
          e.callback = completions.Callback();
          Ok(Enqueue(kGlobalProcessSetId, std::move(e)), "Enqueue");
          const auto enqueued = Clock::now();
          ++submitted;
          if (pipelined) continue;
          completions.WaitFor(submitted);
          const auto seen = Clock::now();
          const auto callback = completions.last_callback();
          enqueue_t.push_back(std::chrono::duration<double>(enqueued - submit).count());
          to_callback_t.push_back(std::chrono::duration<double>(callback - enqueued).count());
          to_caller_t.push_back(std::chrono::duration<double>(seen - callback).count());
        }
        if (pipelined)
          submit_t.push_back(std::chrono::duration<double>(Clock::now() - first).count() / iters);
        completions.WaitFor(submitted);
      };
      raw_loop();  // warm-up: communicators, fusion buffers, the response cache
      core_loop();
      for (int k = 0; k < pairs; ++k) {
        std::vector<float> got = device.Read(recv[k], head.size());
        for (size_t j = 0; j < head.size(); ++j) {
          if (got[j] != static_cast<float>(k * 7 + j + 1))
            Die("the core's allreduce wrote " + std::to_string(got[j]) + " at element " +
                std::to_string(j) + " of buffer " + std::to_string(k));
        }
      }
      std::vector<double> raw_t, core_t;
      for (int r = 0; r < rounds; ++r) {
        auto t0 = Clock::now();
        raw_loop();
        auto t1 = Clock::now();
        core_loop();
        auto t2 = Clock::now();
        raw_t.push_back(std::chrono::duration<double>(t1 - t0).count() / iters);
        core_t.push_back(std::chrono::duration<double>(t2 - t1).count() / iters);
      }
      const double rt = Median(raw_t), ct = Median(core_t);
      std::string parts;
      if (!pipelined) {
        char buf[160];
        std::snprintf(buf, sizeof(buf),
                      ", \"enqueue_us\": %.3f, \"to_callback_us\": %.3f, \"to_caller_us\": %.3f",
                      Median(enqueue_t) * 1e6, Median(to_callback_t) * 1e6,
                      Median(to_caller_t) * 1e6);
        parts = buf;
      } else {
        char buf[64];
        std::snprintf(buf, sizeof(buf), ", \"submit_us\": %.3f", Median(submit_t) * 1e6);
        parts = buf;
      }
      std::printf("{\"bytes\": %lld, \"mode\": \"%s\", \"raw_us\": %.3f, \"core_us\": %.3f, "
                  "\"raw_algbw_gbs\": %.2f, \"core_algbw_gbs\": %.2f, \"ratio\": %.4f%s}\n",
                  static_cast<long long>(count * sizeof(float)), mode, rt * 1e6, ct * 1e6,
                  count * sizeof(float) / rt / 1e9, count * sizeof(float) / ct / 1e9, rt / ct,
                  parts.c_str());
      std::fflush(stdout);
    }
    for (int k = 0; k < pairs; ++k) {
      device.Free(send[k]);
      device.Free(recv[k]);
    }
  }
  Ok(Shutdown("core_path_bench finished"), "Shutdown");
  return 0;
}
