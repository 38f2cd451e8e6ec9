// Heap allocations per steady-state collective on the core's host path
// (issue 38, part 4): allreduces of one cached name, submitted from C++ as
// the TF kernels submit them (a TensorTableEntry handed to Enqueue, ended by
// its callback), each waited for before the next. operator new is replaced
// in this program and counts every allocation, on every thread (the
// background thread, the transport's), from the end of the warm-up to the
// last callback (issue 38's target: none). The caller's own entry (its shape vector) is built with
// the count paused on its thread: what is counted is the core's.
//
// Built with tfring.build.core_module.build_program and run under
// `tfringrun -np N --tcp` by tests/build/test_core_program.py.
//
//   alloc_count [calls warmup bytes]
//
// ALLOC_COUNT_TRACE=N prints the return addresses of the first N counted
// allocations to stderr (resolve them with addr2line -f -C -e alloc_count):
// where the allocations are.
// Prints one JSON line: {"rank", "size", "calls", "allocations", "per_call"}.
#include <execinfo.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <unistd.h>

#include "../../operations.h"
#include "../../tensor_queue.h"
#include "../../transport/registry.h"

using namespace tfring;

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
thread_local bool t_paused = false;
std::atomic<int64_t> g_trace{0};  // allocations left to trace

void Trace() {
  if (g_trace.fetch_sub(1, std::memory_order_relaxed) <= 0) return;
  void* frames[12];
  const int n = backtrace(frames, 12);
  static const char kMark[] = "--- allocation\n";
  (void)!write(2, kMark, sizeof(kMark) - 1);
  backtrace_symbols_fd(frames, n, 2);  // allocates nothing
}

void* Allocate(std::size_t n, std::size_t align) {
  if (g_counting.load(std::memory_order_relaxed) && !t_paused) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (g_trace.load(std::memory_order_relaxed) > 0) {
      t_paused = true;  // backtrace() may allocate on first use
      Trace();
      t_paused = false;
    }
  }
  if (n == 0) n = 1;
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                              : std::malloc(n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "alloc_count: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(2);
}

}  // namespace

void* operator new(std::size_t n) { return Allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  return Allocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

int main(int argc, char** argv) {
  const int64_t calls = argc > 1 ? std::atoll(argv[1]) : 10000;
  const int64_t warmup = argc > 2 ? std::atoll(argv[2]) : 1000;
  const int64_t bytes = argc > 3 ? std::atoll(argv[3]) : 4096;
  const char* trace = std::getenv("ALLOC_COUNT_TRACE");
  {
    void* warm[1];
    backtrace(warm, 1);  // loads libgcc's unwinder before anything is counted
  }
  Status s = StartTransport("tcp", TransportArgs());
  if (!s.ok()) Die("starting tfring over TCP: " + s.message());
  const int64_t count = bytes / static_cast<int64_t>(sizeof(float));
  float* in = static_cast<float*>(std::malloc(count * sizeof(float)));
  float* out = static_cast<float*>(std::malloc(count * sizeof(float)));
  for (int64_t i = 0; i < count; ++i) in[i] = 1.0f;
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
  for (int64_t i = 0; i < warmup + calls; ++i) {
    if (i == warmup) {
      if (trace != nullptr) g_trace.store(std::atoll(trace));
      g_counting.store(true);
    }
    t_paused = true;
    TensorTableEntry e;
    e.type = CollectiveType::ALLREDUCE;
    e.name = "alloc.count";  // short: no allocation of its own
    e.dtype = DataType::FLOAT32;
    e.shape = {count};
    e.reduce_op = ReduceOp::SUM;
    e.input = in;
    e.output = out;
    e.callback = [&done, &failed](const Status& st, int32_t) {
      if (!st.ok()) failed.store(true);
      done.fetch_add(1, std::memory_order_release);
    };
    t_paused = false;
    // Now and then in the warm-up, a pause longer than the core's inline gap
    // (kInlineGap, 500 us): the next collective is then driven by the
    // background thread, not by this one, so both threads have grown their
    // reused scratch (Reused<>, per thread) before anything is counted.
    if (i < warmup && i % 16 == 15) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    s = Enqueue(kGlobalProcessSetId, std::move(e));
    if (!s.ok()) Die("Enqueue: " + s.message());
    while (done.load(std::memory_order_acquire) <= i) std::this_thread::yield();
    if (failed.load()) Die("an allreduce failed");
  }
  g_counting.store(false);
  if (out[0] != static_cast<float>(Size())) Die("wrong result " + std::to_string(out[0]));
  const int64_t n = g_allocations.load();
  std::printf("{\"rank\": %d, \"size\": %d, \"calls\": %lld, \"allocations\": %lld, "
              "\"per_call\": %.3f}\n",
              Rank(), Size(), static_cast<long long>(calls), static_cast<long long>(n),
              static_cast<double>(n) / static_cast<double>(calls));
  std::fflush(stdout);
  Shutdown("alloc_count finished");
  std::_Exit(0);  // static destructors must not race the core's threads
}
