// Unit tests of the GPU executors (ops/gpu_executor.*) over a fake
// NCCL/CUDA on host memory (fake_nccl.h): host staging through the
// executor's pipeline, and the device executor's primitives (copy, scale,
// finishing a reduction, zero) and its fence, and the device watchdog
// failing a fence whose peer died. Built and run by
// tests/common/test_nccl_cpp.py (ASan/UBSan) and by Bazel as
// //tf_ops:gpu_executor_test.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../device_watchdog.h"
#include "../executor.h"
#include "../peer_monitor.h"
#include "../ops/data_plane.h"
#include "../ops/gpu_executor.h"
#include "check.h"
#include "fake_gpu_stack.h"
#include "fake_nccl.h"

using namespace tfring;
using namespace tfring::test;

namespace {

// Host staging: every tensor crosses into page-locked host memory, the
// reduction runs there (here a host plane of one rank: a copy), and the
// result crosses back; the pipeline is the executor's, unchanged.
void TestHostStaging() {
  FakeApi api;
  NcclCommunicators comms(&api, std::make_shared<NcclAbortFlag>());
  GpuShared shared;
  shared.api = &api;
  shared.comms = &comms;
  shared.events = std::make_shared<GpuEventPool>(&api);
  std::unique_ptr<Executor> ex;
  CHECK(HostStagedExecutor::Create(&shared, 0, &ex).ok());
  // A host "plane" of 2 ranks holding the same data: SUM doubles.
  struct Doubling : DataPlane {
    const char* name() const override { return "doubling"; }
    Status Allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp) override {
      std::vector<float> v(count);
      std::memcpy(v.data(), in, count * 4);
      for (auto& x : v) x *= 2;
      std::memcpy(out, v.data(), count * 4);
      (void)dtype;
      return Status::OK();
    }
    Status Allgather(const void*, void*, const std::vector<int64_t>&) override { return {}; }
    Status Broadcast(void*, int64_t, int) override { return {}; }
    Status Alltoall(const void*, const std::vector<int64_t>&, void*,
                    const std::vector<int64_t>&) override { return {}; }
    Status Reducescatter(const void*, void*, const std::vector<int64_t>&, DataType,
                         ReduceOp) override { return {}; }
    Status Barrier() override { return {}; }
  } plane;
  std::vector<char> in = Floats({1, 2, 3}), out(12);
  RunResult run = RunAllreduce(*ex, plane, {{in.data(), out.data(), 3}}, DataType::FLOAT32,
                               ReduceOp::AVERAGE, 1.0, 1.0, 2,
                               [](const std::string&, std::chrono::steady_clock::time_point) {});
  CHECK(run.status.in_progress() && run.pending);  // the copy back is queued
  CHECK(run.pending->Query().ok());
  CHECK(out == Floats({1, 2, 3}));
  // In, then out: even a single tensor is not reduced in its own output.
  CHECK(api.Count("Memcpy") == 2 && shared.staged_copies.load() == 2);
  // A buffer for the plane is never the tensor itself.
  CHECK(ex->PlaneBuffer(out.data(), 1, 12) != out.data());
}

// The GPU executor's primitives and its fence.
void TestExecutorPrimitives() {
  GpuRig rig(2, /*device=*/1);
  FakeApi& api = rig.api;
  Executor& ex = *rig.executor;
  CHECK(ex.FusionBuffer(100) != nullptr && api.current_device == 1);
  std::vector<char> a = Floats({1, 2, 3}), b(12);
  CHECK(ex.Copy(b.data(), a.data(), 12).ok() && b == a);
  CHECK(ex.Scale(b.data(), 3, DataType::FLOAT32, 4.0).ok());
  CHECK(b == Floats({4, 8, 12}));
  // Average over 4 ranks with postscale 2: x * 2 / 4.
  CHECK(ex.FinishReduction(b.data(), 3, DataType::FLOAT32, ReduceOp::AVERAGE, 2.0, 4).ok());
  CHECK(b == Floats({2, 4, 6}));
  std::vector<char> i = Ints({9, -9, 4});
  CHECK(ex.FinishReduction(i.data(), 3, DataType::INT32, ReduceOp::AVERAGE, 1.0, 4).ok());
  CHECK(i == Ints({2, -2, 1}) && api.Logged("Divide 4"));
  CHECK(ex.Zero(b.data(), 12).ok() && b == Floats({0, 0, 0}));
  Status s = ex.Scale(b.data(), 3, DataType::BOOL, 2.0);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT);
  // A fence forms no communicator; it watches the device's once formed.
  std::unique_ptr<DeviceEvent> fence = ex.Fence();
  CHECK(fence != nullptr && api.Count("CommInitRank") == 0);
  api.event_states = {EventState::kPending};
  CHECK(fence->Query().in_progress());
  CHECK(fence->Query().ok());
  std::vector<char> x = Floats({1});
  CHECK(rig.plane->Allreduce(x.data(), x.data(), 1, DataType::FLOAT32, ReduceOp::SUM)
            .in_progress());
  fence = ex.Fence();
  api.event_states = {EventState::kPending};
  api.async_results = {NcclResult::kRemoteError};
  s = fence->Query();
  CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "ncclRemoteError"));
  // The abort flag ends a fence's wait too, communicator or not.
  fence = ex.Fence();
  api.event_states = {EventState::kPending};
  rig.abort->Request("shutting down");
  s = fence->Query();
  CHECK(s.code() == StatusCode::ABORTED && Contains(s.message(), "shutting down"));
}

// The stack's GPU executor, or a host-staged one over the same fakes.
std::unique_ptr<Executor> TakeExecutor(FakeGpuStack* stack, bool staged) {
  std::unique_ptr<Executor> ex;
  if (staged) {
    CHECK(HostStagedExecutor::Create(&stack->shared, 0, &ex).ok());
  } else {
    ex = std::move(stack->executor);
  }
  return ex;
}

// An input's ready event: recorded on the producer's stream, and waited for
// on the executor's stream (never on the host), ahead of what the executor
// queues next. Host staging waits the same way before its device-to-host copy.
void TestReadyEventsWaitOnTheDevice() {
  for (bool staged : {false, true}) {
    FakeGpuStack stack;
    std::unique_ptr<Executor> ex = TakeExecutor(&stack, staged);
    FakeApi& api = stack.api;
    std::shared_ptr<DeviceEvent> ready;
    int producer_stream = 0;
    CHECK(GpuReadyEvent::Record(&stack.shared, 0, &producer_stream, &ready).ok());
    CHECK(ready->waits_on_device() && api.Logged("EventRecord"));
    api.event_states = {EventState::kPending, EventState::kPending};  // would hold a host wait
    CHECK(ex->AwaitInput(*ready).ok());
    CHECK(api.event_states.size() == 2);  // never queried
    std::vector<char> a = Floats({1, 2}), b(8);
    Status copied = ex->Copy(b.data(), a.data(), 8);
    CHECK(copied.ok() || copied.in_progress());
    size_t wait = api.log.size(), copy = api.log.size();
    for (size_t i = 0; i < api.log.size(); ++i) {
      if (api.log[i].rfind("StreamWaitEvent", 0) == 0) wait = i;
      if (api.log[i].rfind("Memcpy", 0) == 0 && copy == api.log.size()) copy = i;
    }
    CHECK(wait < copy);
    // A failed wait names the call and CUDA's error.
    api.stream_wait_result = 700;
    Status s = ex->AwaitInput(*ready);
    CHECK(!s.ok() && Contains(s.message(), "cudaStreamWaitEvent") &&
          Contains(s.message(), "cuda error text 700"));
  }
}

// Complete by event: a collective's fence is one a caller's stream can wait
// for on the device, and a binding holding it after the watchdog has
// completed the collective keeps its event: the pool does not hand that
// event to a later record, which the caller's wait would then wait for.
void TestFenceCompletesByEvent() {
  for (bool staged : {false, true}) {
    FakeGpuStack stack;
    std::unique_ptr<Executor> ex = TakeExecutor(&stack, staged);
    FakeApi& api = stack.api;
    std::vector<char> a = Floats({1, 2}), b(8);
    Status copied = ex->Copy(b.data(), a.data(), 8);
    CHECK(copied.ok() || copied.in_progress());
    std::shared_ptr<DeviceEvent> fence = ex->Fence();
    CHECK(fence != nullptr && fence->waits_on_device());
    int caller_stream = 0;
    api.log.clear();
    CHECK(fence->QueueWait(&caller_stream).ok());
    CHECK(api.log.size() == 1 && api.log[0].rfind("StreamWaitEvent ", 0) == 0);
    const intptr_t event = std::stoll(api.log[0].substr(16));

    // The watchdog completes the collective while the binding still holds
    // the fence.
    DeviceWatchdog watchdog;
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    Status got = Status::Unknown("not finished");
    watchdog.Watch(&stack, fence, [&](const Status& st) {
      std::lock_guard<std::mutex> lock(mu);
      got = st;
      finished = true;
      cv.notify_all();
    });
    {
      std::unique_lock<std::mutex> lock(mu);
      CHECK(cv.wait_for(lock, std::chrono::seconds(5), [&] { return finished; }));
    }
    watchdog.Drain(&stack, 5.0, Status::Aborted("not finished"));
    CHECK(got.ok() && !watchdog.Busy());
    GpuEvent next = nullptr;
    CHECK(stack.shared.events->Acquire(&next) == 0);
    CHECK(reinterpret_cast<intptr_t>(next) != event);
    stack.shared.events->Release(next);
    // Once the binding lets go too, the event goes back to the pool.
    fence.reset();
    CHECK(stack.shared.events->Acquire(&next) == 0 && reinterpret_cast<intptr_t>(next) == event);
    stack.shared.events->Release(next);

    // A failed wait names the fence and CUDA's error.
    std::shared_ptr<DeviceEvent> again = ex->Fence();
    CHECK(again != nullptr);
    api.stream_wait_result = 700;
    Status s = again->QueueWait(&caller_stream);
    CHECK(!s.ok() && Contains(s.message(), "collective's fence") &&
          Contains(s.message(), "cuda error text 700"));
  }
}

// Complete by event: a caller told of the launch may have moved on, so a
// failure of its collective on the device fails the job (the watchdog's
// failure, the device work aborted, the job's stop hook, all before the
// completion runs), where work whose caller still waits fails only itself.
void TestDeviceFailureAfterTheCallerMovedOn() {
  for (bool moved_on : {false, true}) {
    FakeGpuStack stack;
    DeviceWatchdog watchdog;
    std::mutex mu;
    std::condition_variable cv;
    Status stopped = Status::OK();
    std::string aborted;
    watchdog.Arm({nullptr,
                  [&](const std::string& why) {
                    std::lock_guard<std::mutex> lock(mu);
                    aborted = why;
                  },
                  [&](const Status& why) {
                    std::lock_guard<std::mutex> lock(mu);
                    stopped = why;
                  }});
    std::vector<char> a = Floats({1, 2}), b(8);
    Status copied = stack.executor->Copy(b.data(), a.data(), 8);
    CHECK(copied.ok() || copied.in_progress());
    std::shared_ptr<DeviceEvent> fence = stack.executor->Fence();
    CHECK(fence != nullptr);
    stack.api.event_states = {EventState::kError};
    bool finished = false, stopped_first = false;
    Status got;
    watchdog.Watch(
        &stack, fence,
        [&](const Status& st) {
          std::lock_guard<std::mutex> lock(mu);
          got = st;
          stopped_first = !stopped.ok();
          finished = true;
          cv.notify_all();
        },
        moved_on);
    {
      std::unique_lock<std::mutex> lock(mu);
      CHECK(cv.wait_for(lock, std::chrono::seconds(5), [&] { return finished; }));
    }
    watchdog.Drain(&stack, 5.0, Status::Aborted("not finished"));
    CHECK(!got.ok() && Contains(got.message(), "cuda error text 700"));
    std::lock_guard<std::mutex> lock(mu);
    if (moved_on) {
      CHECK(watchdog.failure().message() == got.message());
      CHECK(stopped.message() == got.message() && stopped_first);
      CHECK(Contains(aborted, "cuda error text 700"));
    } else {
      CHECK(watchdog.failure().ok() && stopped.ok() && aborted.empty());
    }
  }
}

// A fused collective's inputs: one wait per producer stream (its latest
// event covers the earlier ones), and one per event recorded on a default
// stream, whose handle names a different stream per device or thread.
void TestOneWaitPerProducerStream() {
  FakeGpuStack stack;
  int a = 0, b = 0;
  auto record = [&](void* stream) {
    std::shared_ptr<DeviceEvent> e;
    CHECK(GpuReadyEvent::Record(&stack.shared, 0, stream, &e).ok());
    return e;
  };
  std::vector<std::shared_ptr<DeviceEvent>> events = {
      record(&a), record(&b), record(&a), record(nullptr), record(&a),
      record(reinterpret_cast<void*>(2)), nullptr};
  std::vector<DeviceEvent*> ready;
  for (auto& e : events) ready.push_back(e.get());
  ready.push_back(events[3].get());  // a group's tensors share one event
  CHECK(stack.executor->AwaitInputs(ready).ok());
  CHECK(stack.api.Count("StreamWaitEvent") == 4);
  CHECK(stack.api.Logged("StreamWaitEvent 5"));   // a's last (the fifth event created)
  CHECK(!stack.api.Logged("StreamWaitEvent 1") && !stack.api.Logged("StreamWaitEvent 3"));
  CHECK(stack.api.Logged("StreamWaitEvent 2") && stack.api.Logged("StreamWaitEvent 4") &&
        stack.api.Logged("StreamWaitEvent 6"));
  // The first failure is returned, and every wait is still queued.
  stack.api.stream_wait_result = 700;
  Status s = stack.executor->AwaitInputs(ready);
  CHECK(!s.ok() && stack.api.Count("StreamWaitEvent") == 8);
}

// A host executor waits for an input's event on the host.
void TestHostExecutorPollsReadyEvents() {
  FakeGpuStack stack;
  std::shared_ptr<DeviceEvent> ready;
  CHECK(GpuReadyEvent::Record(&stack.shared, 0, nullptr, &ready).ok());
  CpuExecutor cpu;
  stack.api.event_states = {EventState::kPending, EventState::kPending};
  CHECK(cpu.AwaitInput(*ready).ok() && stack.api.event_states.empty());
  stack.api.event_states = {EventState::kError};
  Status s = cpu.AwaitInput(*ready);
  CHECK(!s.ok() && Contains(s.message(), "producing a collective's input"));
}

// A peer dies while this rank's collective runs on the device, whose NCCL
// kernel would then wait forever: the watchdog (nobody polls for it) finds
// the death through the peer monitor within 5 s, aborts the communicators
// so that the fence ends, fails the collective with the typed status naming
// the dead rank, and tells the job to stop with the same status.
void TestWatchdogNamesADeadPeer() {
  const pid_t peer = fork();
  if (peer == 0) {
    pause();  // rank 1, alive until killed
    _exit(0);
  }
  CHECK(peer > 0);
  GpuRig rig(2);
  rig.api.events_never_happen = true;
  std::vector<char> x = Floats({1, 2}), out(8);
  RunResult run = RunAllreduce(*rig.executor, *rig.plane, {{x.data(), out.data(), 2}},
                               DataType::FLOAT32, ReduceOp::SUM, 1.0, 1.0, 2,
                               [](const std::string&, std::chrono::steady_clock::time_point) {});
  CHECK(run.status.in_progress() && run.pending);

  auto monitor = std::make_shared<PeerMonitor>(
      0, "host", std::vector<PeerMonitor::Peer>{{0, getpid(), "host"}, {1, peer, "host"}}, 0.05);
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  Status got, stopped;
  DeviceWatchdog watchdog;
  watchdog.Arm({monitor,
                [&rig](const std::string& reason) {
                  rig.abort->Request(reason);
                  rig.comms.AbortAll();
                },
                [&](const Status& why) {
                  std::lock_guard<std::mutex> lock(mu);
                  stopped = why;
                }});
  watchdog.Watch(&rig, std::move(run.pending), [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    got = s;
    finished = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  // The peer lives: its collective is only slow, and nothing fails it.
  CHECK(!cv.wait_for(lock, std::chrono::milliseconds(150), [&] { return finished; }));
  CHECK(watchdog.Busy(&rig) && watchdog.failure().ok());
  kill(peer, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  CHECK(cv.wait_for(lock, std::chrono::seconds(5), [&] { return finished; }));
  CHECK(std::chrono::steady_clock::now() - killed < std::chrono::seconds(5));
  CHECKF(got.code() == StatusCode::ABORTED && got.cause() == FailureCause::PEER_FAILURE &&
             got.rank() == 1 && Contains(got.message(), "rank 1"),
         "got: %s", got.message().c_str());
  CHECK(stopped.cause() == FailureCause::PEER_FAILURE && stopped.rank() == 1);
  CHECK(rig.api.Logged("CommAbort") && rig.abort->requested());
  lock.unlock();
  // The op stays held while its completion runs (so that Drain waits for
  // it): wait for the watchdog to let go, as the background loop would.
  watchdog.Drain(nullptr, 5.0, Status::Aborted("drain timed out"));
  CHECK(!watchdog.Busy() && watchdog.failure().rank() == 1);
  // Work handed over after the death (the abort still stands) fails with
  // that death too, not with the abort.
  run = RunAllreduce(*rig.executor, *rig.plane, {{x.data(), out.data(), 2}}, DataType::FLOAT32,
                     ReduceOp::SUM, 1.0, 1.0, 2,
                     [](const std::string&, std::chrono::steady_clock::time_point) {});
  CHECK(run.status.in_progress() && run.pending);
  Status later;
  watchdog.Watch(&rig, std::move(run.pending), [&later](const Status& s) { later = s; });
  watchdog.Drain(&rig, 5.0, Status::Aborted("drain timed out"));
  CHECKF(later.cause() == FailureCause::PEER_FAILURE && later.rank() == 1, "later: %s",
         later.message().c_str());
  waitpid(peer, nullptr, 0);
}

}  // namespace

int main() {
  TestHostStaging();
  TestExecutorPrimitives();
  TestReadyEventsWaitOnTheDevice();
  TestFenceCompletesByEvent();
  TestDeviceFailureAfterTheCallerMovedOn();
  TestOneWaitPerProducerStream();
  TestHostExecutorPollsReadyEvents();
  TestWatchdogNamesADeadPeer();
  return CheckExitCode();
}
