// Unit tests of execution in the core: the element-wise arithmetic, the CPU
// executor (pack, scale, unpack), the executor table, asynchronous
// completion of planes that return InProgress, and the data-plane selector.
// Built and run by tests/common/test_core_cpp.py (and by Bazel as
// //tf_ops:execution_test).

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../executor.h"
#include "../device_watchdog.h"
#include "../ops/data_plane_selector.h"
#include "../reduction.h"

#include "check.h"

using namespace tfring;

static void TestArithmetic() {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333f}) {
    float back = HalfToFloat(FloatToHalf(f));
    CHECK(std::fabs(back - f) <= std::fabs(f) * 1e-3f + 1e-7f);
  }
  CHECK(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  for (float f : {0.0f, 1.0f, -3.0f, 1e30f, 0.1f}) {
    CHECK(std::fabs(BFloat16ToFloat(FloatToBFloat16(f)) - f) <= std::fabs(f) * 8e-3f);
  }
  int32_t a[3] = {1, 5, -2}, b[3] = {4, 2, 3};
  CHECK(ReduceInto(a, b, 3, DataType::INT32, ReduceOp::MAX).ok());
  CHECK(a[0] == 4 && a[1] == 5 && a[2] == 3);
  uint16_t h[2] = {FloatToHalf(1.5f), FloatToHalf(2.0f)}, h2[2] = {FloatToHalf(0.5f), FloatToHalf(3.0f)};
  CHECK(ReduceInto(h, h2, 2, DataType::FLOAT16, ReduceOp::SUM).ok());
  CHECK(HalfToFloat(h[0]) == 2.0f && HalfToFloat(h[1]) == 5.0f);
  uint8_t t[2] = {1, 0}, u[2] = {0, 0};
  CHECK(ReduceInto(t, u, 2, DataType::BOOL, ReduceOp::SUM).ok() && t[0] == 1 && t[1] == 0);
  int32_t avg[3] = {6, 7, -7};
  CHECK(FinishReduction(avg, 3, DataType::INT32, ReduceOp::AVERAGE, 1.0, 3).ok());
  CHECK(avg[0] == 2 && avg[1] == 2 && avg[2] == -2);
  float fa[2] = {3.0f, 6.0f};
  CHECK(FinishReduction(fa, 2, DataType::FLOAT32, ReduceOp::AVERAGE, 2.0, 3).ok());
  CHECK(std::fabs(fa[0] - 2.0f) < 1e-6f && std::fabs(fa[1] - 4.0f) < 1e-6f);
  CHECK(!ReduceInto(a, b, 3, DataType::INT32, ReduceOp::AVERAGE).ok());
}

// --- Device-aware execution ----------------------------------------------

// A data plane for tests: records what it was asked to run; Allreduce adds
// `peers` copies of the buffer (as if that many other ranks held the same
// values) or, when `stream` is set, queues that work there and returns
// InProgress like a GPU plane.
class FakePlane : public DataPlane {
 public:
  FakePlane(const char* name, bool gpu = false, int peers = 1) : name_(name), gpu_(gpu), peers_(peers) {}
  const char* name() const override { return name_; }
  bool on_gpu() const override { return gpu_; }
  using DataPlane::Allreduce;
  Status Allreduce(const void* input, void* buffer, int64_t count, DataType dtype,
                   ReduceOp op) override {
    calls.push_back(std::string("allreduce ") + ReduceOpName(op));
    last_in_place = input == buffer;
    auto work = [input, buffer, count, dtype, this] {
      CHECK(dtype == DataType::FLOAT32 || dtype == DataType::INT32);
      for (int64_t i = 0; i < count; ++i) {
        if (dtype == DataType::FLOAT32)
          static_cast<float*>(buffer)[i] = static_cast<const float*>(input)[i] * (1 + peers_);
        else
          static_cast<int32_t*>(buffer)[i] = static_cast<const int32_t*>(input)[i] * (1 + peers_);
      }
    };
    if (stream) {
      stream->push_back(work);
      return Status::InProgress();
    }
    work();
    return Status::OK();
  }
  // With `groups`, a plane that reduces several tensors in one call (NCCL's
  // grouped allreduces), each from its input into its output.
  bool reduces_groups() const override { return groups; }
  Status AllreduceGroup(const std::vector<ReduceSlot>& tensors, DataType dtype,
                        ReduceOp op) override {
    CHECK(groups);
    const size_t before = calls.size();
    for (const ReduceSlot& t : tensors) {
      Status s = Allreduce(t.input, t.output, t.count, dtype, op);
      if (!s.ok() && !s.in_progress()) return s;
    }
    calls.resize(before);
    calls.push_back("allreduce group of " + std::to_string(tensors.size()) + " " +
                    ReduceOpName(op));
    return stream ? Status::InProgress() : Status::OK();
  }
  Status Allgather(const void*, void*, const std::vector<int64_t>&) override { return Status::OK(); }
  Status Broadcast(void*, int64_t, int) override { return Status::OK(); }
  Status Alltoall(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&) override {
    return Status::OK();
  }
  // Rank `keep` of recv_counts.size() ranks: its share of the sum over 1 + peers ranks.
  Status Reducescatter(const void* send, void* recv, const std::vector<int64_t>& counts, DataType,
                       ReduceOp) override {
    calls.push_back("reducescatter");
    int64_t offset = 0;
    for (int r = 0; r < keep; ++r) offset += counts[r];
    for (int64_t i = 0; i < counts[keep]; ++i)
      static_cast<float*>(recv)[i] = static_cast<const float*>(send)[offset + i] * (1 + peers_);
    return Status::OK();
  }
  Status Barrier() override { return Status::OK(); }

  std::vector<std::string> calls;
  bool groups = false;
  bool last_in_place = false;
  std::vector<std::function<void()>>* stream = nullptr;
  int keep = 0;

 private:
  const char* name_;
  bool gpu_;
  int peers_;
};

static PhaseFn Recorder(std::vector<std::string>* phases) {
  return [phases](const std::string& what, std::chrono::steady_clock::time_point) {
    phases->push_back(what);
  };
}

// Pack, scale and unpack on the CPU: fused and single-tensor paths, a joined
// rank's zeros, averaging, and reducescatter's prescale on a copy.
static void TestCpuExecutor() {
  CpuExecutor cpu;
  FakePlane plane("FAKE");  // two ranks holding the same values
  {
    float a[2] = {1, 2}, b[1] = {3}, out_a[2] = {0, 0}, out_b[1] = {0};
    std::vector<ReduceSlot> slots = {{a, out_a, 2}, {b, out_b, 1}, {nullptr, nullptr, 2}};
    PackedReduction packed;
    CHECK(cpu.PackAllreduce(slots, DataType::FLOAT32, 2.0, &packed).ok());
    CHECK(packed.fused && packed.count == 5 && packed.buffer == cpu.FusionBuffer(20));
    CHECK((packed.layout.offsets == std::vector<int64_t>{0, 8, 12}));
    const float* buf = static_cast<const float*>(packed.buffer);
    CHECK(buf[0] == 2 && buf[1] == 4 && buf[2] == 6 && buf[3] == 0 && buf[4] == 0);
    CHECK(a[0] == 1 && a[1] == 2);  // inputs untouched
    CHECK(plane.Allreduce(packed.buffer, packed.count, DataType::FLOAT32, ReduceOp::SUM).ok());
    CHECK(cpu.UnpackAllreduce(packed, slots, DataType::FLOAT32, ReduceOp::AVERAGE, 0.5, 2).ok());
    // (x * 2 prescale) * 2 ranks / 2 (average) * 0.5 postscale = x
    CHECK(out_a[0] == 1 && out_a[1] == 2 && out_b[0] == 3);
  }
  {
    // One tensor is reduced from its input straight into its output: no
    // fusion buffer, no phases for it, and no staging copy (the plane gets
    // the input and the output, not the output with the input copied in).
    int32_t in[3] = {6, 7, -7}, out[3] = {0, 0, 0};
    std::vector<std::string> phases;
    RunResult run = RunAllreduce(cpu, plane, {{in, out, 3}}, DataType::INT32, ReduceOp::AVERAGE,
                                 1.0, 1.0, 3, Recorder(&phases));
    CHECK(run.status.ok() && !run.pending);
    CHECK(!plane.last_in_place);
    // (x * 2) / 3 with C truncation: 12/3, 14/3, -14/3
    CHECK(out[0] == 4 && out[1] == 4 && out[2] == -4 && in[0] == 6 && in[1] == 7 && in[2] == -7);
  }
  {
    // A prescale must not touch the input: the output is then scaled in
    // place and reduced there.
    float in[2] = {1, 2}, out[2] = {0, 0};
    std::vector<std::string> phases;
    RunResult run = RunAllreduce(cpu, plane, {{in, out, 2}}, DataType::FLOAT32, ReduceOp::SUM,
                                 3.0, 1.0, 2, Recorder(&phases));
    CHECK(run.status.ok() && plane.last_in_place);
    CHECK(out[0] == 6 && out[1] == 12 && in[0] == 1 && in[1] == 2);
    CHECK((phases == std::vector<std::string>{"FAKE_ALLREDUCE"}));
    CHECK((plane.calls.back() == "allreduce Sum"));  // AVERAGE is a SUM on the plane
  }
  {
    float x[2] = {1, 2}, y[2] = {3, 4}, ox[2], oy[2];
    std::vector<std::string> phases;
    RunResult run = RunAllreduce(cpu, plane, {{x, ox, 2}, {y, oy, 2}}, DataType::FLOAT32,
                                 ReduceOp::SUM, 1.0, 1.0, 2, Recorder(&phases));
    CHECK(run.status.ok() && ox[0] == 2 && ox[1] == 4 && oy[0] == 6 && oy[1] == 8);
    CHECK((phases == std::vector<std::string>{"MEMCPY_IN_FUSION_BUFFER", "FAKE_ALLREDUCE",
                                              "MEMCPY_OUT_FUSION_BUFFER"}));
  }
  {
    // bool cannot be prescaled: the error comes back and the plane is not asked.
    uint8_t t[2] = {1, 0}, o[2];
    const size_t before = plane.calls.size();
    std::vector<std::string> phases;
    RunResult run = RunAllreduce(cpu, plane, {{t, o, 2}}, DataType::BOOL, ReduceOp::SUM, 2.0,
                                 1.0, 2, Recorder(&phases));
    CHECK(!run.status.ok() && Contains(run.status.message(), "bool") && plane.calls.size() == before);
  }
  {
    // Reducescatter over 2 ranks, this rank (1) keeps elements [2, 4).
    float in[4] = {1, 2, 3, 4}, out[2] = {0, 0};
    plane.keep = 1;
    std::vector<std::string> phases;
    RunResult run = RunReducescatter(cpu, plane, in, out, {2, 2}, 1, DataType::FLOAT32,
                                     ReduceOp::AVERAGE, 3.0, 1.0, Recorder(&phases));
    // 3 * x * 2 ranks / 2
    CHECK(run.status.ok() && out[0] == 9 && out[1] == 12);
    CHECK(in[2] == 3 && in[3] == 4);  // prescaled on a copy, not on the input
    CHECK((phases == std::vector<std::string>{"FAKE_REDUCESCATTER"}));
    const void* send = nullptr;
    void* recv = nullptr;
    CHECK(cpu.PackReducescatter(in, 4, out, DataType::FLOAT32, 1.0, &send, &recv).ok());
    CHECK(send == in && recv == out);  // nothing to scale: no copy
  }
}

// One executor per device and staging kind, made once; GPU tensors without a
// GPU build are a clear error.
static void TestExecutorTable() {
  ExecutorTable none;
  Executor* ex = nullptr;
  Executor* again = nullptr;
  CHECK(none.Get(kCpuDevice, false, &ex).ok() && ex->device() == kCpuDevice);
  CHECK(none.Get(kCpuDevice, false, &again).ok() && again == ex);
  Status s = none.Get(0, false, &ex);
  CHECK(!s.ok() && s.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(Contains(s.message(), "no GPU support") && Contains(s.message(), "GPU:0"));
  CHECK(!none.Get(kCpuDevice, true, &ex).ok());  // CPU tensors never go to a GPU plane

  struct FakeGpuExecutor : CpuExecutor {
    FakeGpuExecutor(int32_t d, bool staged) : device_(d), staged(staged) {}
    int32_t device() const override { return device_; }
    int32_t device_;
    bool staged;
  };
  std::vector<std::string> made;
  ExecutorTable table([&made](int32_t device, bool staged, std::unique_ptr<Executor>* out) {
    made.push_back(DeviceName(device) + (staged ? " staged" : " direct"));
    out->reset(new FakeGpuExecutor(device, staged));
    return Status::OK();
  });
  Executor *direct = nullptr, *staged = nullptr, *other = nullptr;
  CHECK(table.Get(0, true, &direct).ok() && table.Get(0, false, &staged).ok());
  CHECK(table.Get(1, true, &other).ok() && table.Get(0, true, &again).ok());
  CHECK(direct != staged && direct != other && again == direct);
  CHECK(!static_cast<FakeGpuExecutor*>(direct)->staged && static_cast<FakeGpuExecutor*>(staged)->staged);
  CHECK((made == std::vector<std::string>{"GPU:0 direct", "GPU:0 staged", "GPU:1 direct"}));
  // Each executor has its own fusion buffer.
  CHECK(table.Get(kCpuDevice, false, &ex).ok() && ex->FusionBuffer(64) != direct->FusionBuffer(64));
}

// An executor that behaves like a device: its steps are queued on a stream
// and run only when its fence is found complete, after `polls` queries.
class FakeStreamExecutor : public CpuExecutor {
 public:
  explicit FakeStreamExecutor(int polls) : polls_(polls) {}
  int32_t device() const override { return 0; }
  Status Copy(void* dst, const void* src, int64_t bytes) override {
    stream.push_back([=] { std::memcpy(dst, src, bytes); });
    return Status::InProgress();
  }
  Status Zero(void* dst, int64_t bytes) override {
    stream.push_back([=] { std::memset(dst, 0, bytes); });
    return Status::InProgress();
  }
  Status Scale(void* buf, int64_t count, DataType dtype, double factor) override {
    stream.push_back([=] { ScaleBuffer(buf, count, dtype, factor); });
    return Status::InProgress();
  }
  Status FinishReduction(void* buf, int64_t count, DataType dtype, ReduceOp op, double post,
                         int ranks) override {
    stream.push_back([=] { tfring::FinishReduction(buf, count, dtype, op, post, ranks); });
    return Status::InProgress();
  }
  std::unique_ptr<DeviceEvent> Fence() override {
    if (stream.empty()) return nullptr;
    struct Event : DeviceEvent {
      std::vector<std::function<void()>> work;
      int polls;
      int* queries;
      Status Query() override {
        ++*queries;
        if (polls-- > 0) return Status::InProgress();
        for (auto& w : work) w();
        work.clear();
        return Status::OK();
      }
    };
    auto e = std::make_unique<Event>();
    e->work.swap(stream);
    e->polls = polls_;
    e->queries = &queries;
    return e;
  }
  std::vector<std::function<void()>> stream;
  int queries = 0;

 private:
  int polls_;
};

// A plane that returns InProgress: the collective completes only once its
// fence has happened, and then from the device watchdog's thread, without
// anyone polling for it (the background loop no longer does).
static void TestAsyncCompletion() {
  FakeStreamExecutor gpu(3);
  FakePlane nccl("FAKE_GPU", true);
  nccl.stream = &gpu.stream;
  float a[2] = {1, 2}, b[2] = {3, 4}, oa[2] = {0, 0}, ob[2] = {0, 0};
  std::vector<std::string> phases;
  RunResult run = RunAllreduce(gpu, nccl, {{a, oa, 2}, {b, ob, 2}}, DataType::FLOAT32,
                               ReduceOp::SUM, 1.0, 1.0, 2, Recorder(&phases));
  CHECK(run.status.in_progress() && run.pending != nullptr);
  CHECK(oa[0] == 0 && ob[1] == 0);  // nothing has run yet
  CHECK(gpu.stream.empty());        // the fence took all the queued work

  DeviceWatchdog watchdog;
  int set_a = 0, set_b = 0;  // two process sets' work
  std::mutex mu;             // completions run on the watchdog's thread
  std::vector<std::string> finished;
  bool on_watchdog = true;
  watchdog.Watch(&set_a, std::move(run.pending), [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    on_watchdog = on_watchdog && DeviceWatchdog::OnWatchdogThread();
    finished.push_back(s.ok() ? "first" : "first failed");
  });
  // A second collective started after the first, whose device work fails.
  struct Failing : DeviceEvent {
    Status Query() override { return Status::Aborted("device error"); }
  };
  watchdog.Watch(&set_a, std::make_unique<Failing>(), [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    finished.push_back("second: " + s.message());
  });
  // Collectives the device finishes together complete in the order they
  // were started.
  const int kMany = 200;
  for (int i = 0; i < kMany; ++i) {
    gpu.stream.push_back([] {});
    watchdog.Watch(&set_b, gpu.Fence(), [&, i](const Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      finished.push_back(s.ok() ? std::to_string(i) : "failed");
    });
  }
  // Nobody polls: the watchdog's thread completes everything by itself.
  const auto start = std::chrono::steady_clock::now();
  while (watchdog.Busy() && std::chrono::steady_clock::now() - start < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(!watchdog.Busy());
  watchdog.Drain(&set_a, 5.0, Status::Aborted("not finished"));
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(on_watchdog && !DeviceWatchdog::OnWatchdogThread());
    CHECKF(finished.size() == 2 + kMany, "%zu finished", finished.size());
    std::vector<std::string> set_a_order, set_b_order;
    for (const auto& f : finished) {
      (f == "first" || Contains(f, "second") ? set_a_order : set_b_order).push_back(f);
    }
    // The failing one finished at its first query, the first at its 4th.
    CHECK((set_a_order == std::vector<std::string>{"second: device error", "first"}));
    bool in_order = set_b_order.size() == static_cast<size_t>(kMany);
    for (int i = 0; in_order && i < kMany; ++i) in_order = set_b_order[i] == std::to_string(i);
    CHECK(in_order);
  }
  CHECK(gpu.queries == 4 + 4 * kMany);
  CHECK(oa[0] == 2 && oa[1] == 4 && ob[0] == 6 && ob[1] == 8);

  // A plane left running with an executor that cannot wait for it.
  CpuExecutor cpu;
  std::vector<std::function<void()>> nowhere;
  nccl.stream = &nowhere;
  run = RunAllreduce(cpu, nccl, {{a, oa, 2}}, DataType::FLOAT32, ReduceOp::SUM, 1.0, 1.0, 2,
                     Recorder(&phases));
  CHECK(!run.status.ok() && !run.status.in_progress() && Contains(run.status.message(), "no event"));

  // Shutdown: what does not finish in time is completed with the reason;
  // another set's work is left alone.
  FakeStreamExecutor slow(1 << 30);
  slow.stream.push_back([] {});
  slow.stream.push_back([] {});
  Status got;
  watchdog.Watch(&set_a, slow.Fence(), [&got](const Status& s) { got = s; });
  slow.stream.push_back([] {});
  Status other;
  watchdog.Watch(&set_b, slow.Fence(), [&other](const Status& s) { other = s; });
  watchdog.Drain(&set_a, 0.01, Status::Aborted("shut down"));
  CHECK(!watchdog.Busy(&set_a) && watchdog.Busy(&set_b));
  CHECK(got.code() == StatusCode::ABORTED && got.message() == "shut down");
  watchdog.Drain(&set_b, 0.01, Status::Aborted("shut down too"));
  CHECK(!watchdog.Busy() && other.message() == "shut down too");
}

// A plane that reduces groups gets fused tensors of 4 MB or more on average
// one by one, in one call, with no copy into or out of the fusion buffer;
// smaller ones, and what needs that buffer (a joined rank's zeros, a
// prescale that must not touch the inputs), still go through it.
static void TestGroupedReduction() {
  CpuExecutor cpu;
  FakePlane plane("GROUPS");  // two ranks holding the same values
  plane.groups = true;
  const int64_t n = 1 << 20;  // 4 MB of floats
  std::vector<float> x(n, 1.0f), y(n, 3.0f), ox(n), oy(n);
  x[n - 1] = 2;
  std::vector<std::string> phases;
  RunResult run = RunAllreduce(cpu, plane, {{x.data(), ox.data(), n}, {y.data(), oy.data(), n}},
                               DataType::FLOAT32, ReduceOp::SUM, 1.0, 1.0, 2, Recorder(&phases));
  CHECK(run.status.ok() && !run.pending);
  CHECK(ox[0] == 2 && ox[n - 1] == 4 && oy[0] == 6 && oy[n - 1] == 6 && x[0] == 1);
  CHECK((phases == std::vector<std::string>{"GROUPS_ALLREDUCE"}));
  CHECK((plane.calls == std::vector<std::string>{"allreduce group of 2 Sum"}));
  CHECK(cpu.fusion_capacity() == 0);  // the fusion buffer was never needed

  // Average and a postscale are applied to each output where it lies.
  run = RunAllreduce(cpu, plane, {{x.data(), ox.data(), n}, {y.data(), oy.data(), n}},
                     DataType::FLOAT32, ReduceOp::AVERAGE, 1.0, 3.0, 2, Recorder(&phases));
  CHECK(run.status.ok() && ox[0] == 3 && ox[n - 1] == 6 && oy[0] == 9);
  CHECK(plane.calls.back() == "allreduce group of 2 Sum" && cpu.fusion_capacity() == 0);

  // Small tensors, a prescale, or a joined rank's empty slot take the buffer.
  for (int why = 0; why < 3; ++why) {
    phases.clear();
    std::vector<ReduceSlot> slots = {{x.data(), ox.data(), n}, {y.data(), oy.data(), why ? n : 8}};
    if (why == 2) slots.push_back({nullptr, nullptr, 4});
    run = RunAllreduce(cpu, plane, slots, DataType::FLOAT32, ReduceOp::SUM, why == 1 ? 2.0 : 1.0,
                       1.0, 2, Recorder(&phases));
    CHECK(run.status.ok() && plane.calls.back() == "allreduce Sum");
    CHECK((phases == std::vector<std::string>{"MEMCPY_IN_FUSION_BUFFER", "GROUPS_ALLREDUCE",
                                              "MEMCPY_OUT_FUSION_BUFFER"}));
    const float f = why == 1 ? 4 : 2;
    CHECK(ox[0] == 1 * f && ox[n - 1] == 2 * f && oy[0] == 3 * f);
  }
  CHECK(cpu.fusion_capacity() > 0);

  // On an asynchronous device the group is queued, and the fence covers it.
  FakeStreamExecutor gpu(1);
  FakePlane nccl("FAKE_GPU", true);
  nccl.groups = true;
  nccl.stream = &gpu.stream;
  std::fill(ox.begin(), ox.end(), 0.0f);
  run = RunAllreduce(gpu, nccl, {{x.data(), ox.data(), n}, {y.data(), oy.data(), n}},
                     DataType::FLOAT32, ReduceOp::SUM, 1.0, 1.0, 2, Recorder(&phases));
  CHECK(run.status.in_progress() && run.pending != nullptr && ox[0] == 0);
  CHECK(nccl.calls.back() == "allreduce group of 2 Sum");
  CHECK(run.pending->Query().in_progress() && run.pending->Query().ok());
  CHECK(ox[0] == 2 && oy[n - 1] == 6);
}

// The selector picks by device, then by size.
static void TestSelectorByDevice() {
  auto* fallback = new FakePlane("MPI");
  auto* shm = new FakePlane("SHM");
  DataPlaneChoice choice;
  choice.shm_min_bytes = 1024;
  DataPlaneSelector sel{std::unique_ptr<DataPlane>(fallback), std::unique_ptr<DataPlane>(shm),
                        nullptr, choice};
  // Before any collective, last_used() names the real fallback plane.
  CHECK(std::string(sel.last_used()) == "MPI");
  CHECK(sel.Select(CollectiveType::ALLREDUCE, kCpuDevice, 100) == fallback);
  CHECK(sel.Select(CollectiveType::ALLREDUCE, kCpuDevice, 4096) == shm);
  CHECK(std::string(sel.last_used()) == "SHM");
  // No GPU plane: GPU tensors take the host planes (host staged).
  CHECK(!sel.has_gpu() && sel.Select(CollectiveType::ALLREDUCE, 0, 4096) == shm);
  CHECK(sel.Select(CollectiveType::ALLTOALL, 0, 4096) == fallback);

  auto* gpu = new FakePlane("GPU", true);
  sel.set_gpu(std::unique_ptr<DataPlane>(gpu));
  for (CollectiveType t : {CollectiveType::ALLREDUCE, CollectiveType::ALLGATHER,
                           CollectiveType::BROADCAST, CollectiveType::ALLTOALL,
                           CollectiveType::REDUCESCATTER}) {
    CHECK(sel.Select(t, 0, 10) == gpu && sel.Select(t, 3, 1 << 20) == gpu);
  }
  CHECK(std::string(sel.last_used()) == "GPU");
  CHECK(sel.Select(CollectiveType::ALLREDUCE, kCpuDevice, 4096) == shm);
  CHECK(sel.Select(CollectiveType::ALLREDUCE, kCpuDevice, 10) == fallback);
  // Used as a plane itself, the selector moves host memory only.
  float x[300] = {1};
  CHECK(sel.Allreduce(x, 300, DataType::FLOAT32, ReduceOp::SUM).ok());
  CHECK(shm->calls.size() == 1 && gpu->calls.empty() && x[0] == 2);

  // The executor follows the chosen plane's memory.
  ExecutorTable table([](int32_t, bool staged, std::unique_ptr<Executor>* out) {
    out->reset(new FakeStreamExecutor(staged ? 1 : 2));
    return Status::OK();
  });
  Executor* ex = nullptr;
  DataPlane* plane = sel.Select(CollectiveType::ALLREDUCE, 0, 10);
  CHECK(table.Get(0, plane->on_gpu(), &ex).ok() && ex->device() == 0);
}

int main() {
  TestArithmetic();
  TestCpuExecutor();
  TestExecutorTable();
  TestAsyncCompletion();
  TestGroupedReduction();
  TestSelectorByDevice();
  return CheckExitCode();
}
