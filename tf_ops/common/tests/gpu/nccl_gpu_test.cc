// The GPU executor and the NCCL data plane on a real GPU, at np=1 (the GPU
// test machine has one GPU and NCCL refuses two ranks on one device): every
// collective and dtype on device memory, run through the executor's pipeline
// as the core runs it, against values computed on the host with the core's
// own arithmetic (reduction.h), fusion through the device buffer, a real NCCL
// error carried up as a Status, and a communicator whose peer never comes
// ended by the abort flag and by the timeout instead of hanging.
//
// Needs a GPU, nvcc and NCCL; built and run by tests/common/test_nccl_gpu.py
// (pytest -m gpu). Not part of the library or of CI.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../../common.h"
#include "../../executor.h"
#include "../../ops/cuda/cuda_nccl_api.h"
#include "../../ops/gpu_executor.h"
#include "../../ops/nccl_data_plane.h"
#include "../../reduction.h"

#include "../check.h"

using namespace tfring;


#define CHECK_OK(expr)                                                                  \
  do {                                                                                  \
    ++g_checks;                                                                         \
    Status _s = (expr);                                                                 \
    if (!_s.ok()) {                                                                     \
      ++g_failures;                                                                     \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #expr,              \
                   _s.message().c_str());                                               \
    }                                                                                   \
  } while (0)

#define CUDA_OK(expr)                                                                   \
  do {                                                                                  \
    cudaError_t _e = (expr);                                                            \
    if (_e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #expr,              \
                   cudaGetErrorString(_e));                                             \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)

namespace {

const DataType kDtypes[] = {DataType::FLOAT16, DataType::BFLOAT16, DataType::FLOAT32,
                            DataType::FLOAT64, DataType::INT32,    DataType::INT64};
const ReduceOp kOps[] = {ReduceOp::SUM, ReduceOp::AVERAGE, ReduceOp::MIN, ReduceOp::MAX,
                         ReduceOp::PRODUCT};

// Host values of `dtype`, element i set from a small integer (exact in every
// dtype), varied so that scaling rounds in float16/bfloat16.
std::vector<char> HostValues(DataType dtype, int64_t n, int seed) {
  std::vector<char> v(n * DataTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(((i * 7 + seed * 13) % 41) - 20);
    switch (dtype) {
      case DataType::FLOAT16: reinterpret_cast<uint16_t*>(v.data())[i] = FloatToHalf(float(x)); break;
      case DataType::BFLOAT16:
        reinterpret_cast<uint16_t*>(v.data())[i] = FloatToBFloat16(float(x));
        break;
      case DataType::FLOAT32: reinterpret_cast<float*>(v.data())[i] = float(x); break;
      case DataType::FLOAT64: reinterpret_cast<double*>(v.data())[i] = x; break;
      case DataType::INT32: reinterpret_cast<int32_t*>(v.data())[i] = int32_t(x); break;
      case DataType::INT64: reinterpret_cast<int64_t*>(v.data())[i] = int64_t(x) * 1000000007LL; break;
      default: break;
    }
  }
  return v;
}

double At(const std::vector<char>& v, DataType dtype, int64_t i) {
  switch (dtype) {
    case DataType::FLOAT16: return HalfToFloat(reinterpret_cast<const uint16_t*>(v.data())[i]);
    case DataType::BFLOAT16: return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(v.data())[i]);
    case DataType::FLOAT32: return reinterpret_cast<const float*>(v.data())[i];
    case DataType::FLOAT64: return reinterpret_cast<const double*>(v.data())[i];
    case DataType::INT32: return reinterpret_cast<const int32_t*>(v.data())[i];
    case DataType::INT64: return double(reinterpret_cast<const int64_t*>(v.data())[i]);
    default: return 0;
  }
}

// Device results equal the host arithmetic: exactly for integers and
// float64, within one rounding step for the narrower floats (the GPU may
// fuse or order a multiply differently).
bool SameValues(const std::vector<char>& got, const std::vector<char>& want, DataType dtype,
                int64_t n, const std::string& what) {
  if (dtype == DataType::INT32 || dtype == DataType::INT64 || dtype == DataType::FLOAT64) {
    if (std::memcmp(got.data(), want.data(), n * DataTypeSize(dtype)) == 0) return true;
  } else {
    const double tol = dtype == DataType::FLOAT32 ? 1e-6 : 1e-2;
    bool ok = true;
    for (int64_t i = 0; i < n && ok; ++i) {
      const double a = At(got, dtype, i), b = At(want, dtype, i);
      ok = std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b));
    }
    if (ok) return true;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (At(got, dtype, i) != At(want, dtype, i)) {
      std::fprintf(stderr, "%s (%s): element %lld is %g, expected %g\n", what.c_str(),
                   DataTypeName(dtype), static_cast<long long>(i), At(got, dtype, i),
                   At(want, dtype, i));
      break;
    }
  }
  return false;
}

// What a reduction over one rank gives: the core's host arithmetic.
std::vector<char> Expected(std::vector<char> v, DataType dtype, int64_t n, ReduceOp op,
                           double prescale, double postscale) {
  ScaleBuffer(v.data(), n, dtype, prescale);
  FinishReduction(v.data(), n, dtype, op, postscale, 1);
  return v;
}

struct Gpu {
  void* Alloc(int64_t bytes) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, std::max<int64_t>(bytes, 1)));
    ptrs.push_back(p);
    return p;
  }
  void* Upload(const std::vector<char>& host) {
    void* p = Alloc(host.size());
    CUDA_OK(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice));
    return p;
  }
  std::vector<char> Download(const void* p, int64_t bytes) {
    std::vector<char> host(bytes);
    CUDA_OK(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
  ~Gpu() {
    for (void* p : ptrs) cudaFree(p);
  }
  std::vector<void*> ptrs;
};

// Polls like the background thread: never synchronises the stream.
Status Wait(NcclDataPlane& plane, GpuCompletion* done, int* polls = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int n = 1;; ++n) {
    Status s = plane.Poll(done);
    if (!s.in_progress()) {
      if (polls) *polls = n;
      return s;
    }
    if (std::chrono::steady_clock::now() > deadline) return Status::Unknown("poll timed out");
    std::this_thread::yield();
  }
}

const BroadcastBytesFn kAlone = [](std::string*) { return Status::OK(); };

// Polls a fence like the background thread polls its in-flight collectives.
Status WaitEvent(std::unique_ptr<DeviceEvent> event, int* polls = nullptr) {
  if (!event) return Status::OK();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int n = 1;; ++n) {
    Status s = event->Query();
    if (!s.in_progress()) {
      if (polls) *polls = n;
      return s;
    }
    if (std::chrono::steady_clock::now() > deadline) return Status::Unknown("poll timed out");
    std::this_thread::yield();
  }
}

Status WaitRun(RunResult run, int* polls = nullptr) {
  if (!run.status.in_progress()) return run.status;
  return WaitEvent(std::move(run.pending), polls);
}

void NoPhase(const std::string&, std::chrono::steady_clock::time_point) {}

// A GPU executor on GPU 0 with the plane bound to its stream: what the core
// routes a GPU collective to.
struct Rig {
  GpuShared shared;
  std::unique_ptr<Executor> executor;
  NcclDataPlane* plane;
  Rig(NcclApi* api, NcclCommunicators* comms, NcclDataPlane* p) : plane(p) {
    shared.api = api;
    shared.comms = comms;
    shared.events = std::make_shared<GpuEventPool>(api);
    Status s = GpuExecutor::Create(&shared, 0, &executor);
    if (!s.ok()) {
      std::fprintf(stderr, "GpuExecutor: %s\n", s.message().c_str());
      std::exit(2);
    }
    plane->Bind(executor->context());
  }
  Status Allreduce(const std::vector<ReduceSlot>& slots, DataType dtype, ReduceOp op,
                   double pre, double post, int* polls = nullptr) {
    return WaitRun(RunAllreduce(*executor, *plane, slots, dtype, op, pre, post, plane->size(),
                                NoPhase),
                   polls);
  }
  Status Reducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op, double pre, double post) {
    return WaitRun(RunReducescatter(*executor, *plane, in, out, counts, plane->rank(), dtype, op,
                                    pre, post, NoPhase));
  }
};

void TestAllreduce(Rig& rig) {
  const int64_t n = 1000;
  const double scales[][2] = {{1.0, 1.0}, {0.5, 3.0}, {1.5, 0.25}};
  for (DataType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      for (const auto& sc : scales) {
        Gpu gpu;
        const std::vector<char> in = HostValues(dtype, n, int(op));
        const std::vector<char> want = Expected(in, dtype, n, op, sc[0], sc[1]);
        const std::string what = std::string("allreduce ") + ReduceOpName(op) + " pre " +
                                 std::to_string(sc[0]) + " post " + std::to_string(sc[1]);
        // Out of place: the input must stay as it was.
        void* send = gpu.Upload(in);
        void* recv = gpu.Alloc(in.size());
        CHECK_OK(rig.Allreduce({{send, recv, n}}, dtype, op, sc[0], sc[1]));
        CHECK(SameValues(gpu.Download(recv, in.size()), want, dtype, n, what + " out of place"));
        CHECK(gpu.Download(send, in.size()) == in);
        // In place.
        CHECK_OK(rig.Allreduce({{send, send, n}}, dtype, op, sc[0], sc[1]));
        CHECK(SameValues(gpu.Download(send, in.size()), want, dtype, n, what + " in place"));
      }
    }
  }
}

// Several tensors in one reduction: small ones packed into the fusion buffer
// by the copy kernel (with a joined rank's zeros and a prescale), or
// (`grouped`: 4 MB and more on average, no prescale) reduced one by one in a
// single NCCL group, each in its own memory (the last one in place).
void TestFusedAllreduce(Rig& rig, bool grouped) {
  const std::vector<int64_t> counts = grouped ? std::vector<int64_t>{3, 3 << 20, 3 << 20}
                                              : std::vector<int64_t>{3, 1000, 1, 4097, 0, 64};
  for (DataType dtype : kDtypes) {
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVERAGE, ReduceOp::MAX}) {
      Gpu gpu;
      const double pre = grouped ? 1.0 : 2.0;
      std::vector<ReduceSlot> tensors;
      std::vector<std::vector<char>> inputs;
      for (size_t i = 0; i < counts.size(); ++i) {
        inputs.push_back(HostValues(dtype, counts[i], int(i)));
        ReduceSlot t;
        t.count = counts[i];
        t.input = gpu.Upload(inputs.back());
        t.output = grouped && i + 1 == counts.size()
                       ? const_cast<void*>(t.input)
                       : gpu.Alloc(inputs.back().size());
        tensors.push_back(t);
      }
      if (!grouped) {
        // A tensor this rank never submitted (it has joined) takes part as zeros.
        ReduceSlot joined;
        joined.count = 17;
        tensors.push_back(joined);
      }
      CHECK_OK(rig.Allreduce(tensors, dtype, op, pre, 0.5));
      for (size_t i = 0; i < inputs.size(); ++i) {
        const std::vector<char> want = Expected(inputs[i], dtype, counts[i], op, pre, 0.5);
        CHECK(SameValues(gpu.Download(tensors[i].output, want.size()), want, dtype, counts[i],
                         std::string(grouped ? "grouped" : "fused") + " allreduce tensor " +
                             std::to_string(i)));
      }
    }
  }
}

void TestOtherCollectives(Rig& rig, cudaStream_t stream) {
  NcclDataPlane& plane = *rig.plane;
  for (DataType dtype : kDtypes) {
    Gpu gpu;
    const int64_t n = 777;
    const std::vector<char> in = HostValues(dtype, n, 5);
    const int64_t bytes = static_cast<int64_t>(in.size());
    GpuCompletion done;

    void* send = gpu.Upload(in);
    void* recv = gpu.Alloc(bytes);
    CHECK_OK(plane.Allgather(0, stream, send, recv, {bytes}, &done));
    CHECK_OK(Wait(plane, &done));
    CHECK(gpu.Download(recv, bytes) == in);

    void* buf = gpu.Upload(in);
    CHECK_OK(plane.Broadcast(0, stream, buf, buf, bytes, 0, &done));
    CHECK_OK(Wait(plane, &done));
    CHECK(gpu.Download(buf, bytes) == in);
    Status bad_root = plane.Broadcast(0, stream, buf, buf, bytes, 1, &done);
    CHECK(bad_root.code() == StatusCode::INVALID_ARGUMENT);

    void* a2a = gpu.Alloc(bytes);
    CHECK_OK(plane.Alltoall(0, stream, send, {bytes}, a2a, {bytes}, &done));
    CHECK_OK(Wait(plane, &done));
    CHECK(gpu.Download(a2a, bytes) == in);

    for (ReduceOp op : kOps) {
      void* rs = gpu.Alloc(bytes);
      CHECK_OK(rig.Reducescatter(send, rs, {n}, dtype, op, 0.5, 4.0));
      CHECK(SameValues(gpu.Download(rs, bytes), Expected(in, dtype, n, op, 0.5, 4.0), dtype, n,
                       std::string("reducescatter ") + ReduceOpName(op)));
      CHECK(gpu.Download(send, bytes) == in);
    }
  }
}

// A big collective is still running when first polled; the poll says so
// rather than blocking.
void TestAsynchronousCompletion(Rig& rig) {
  Gpu gpu;
  const int64_t n = 64 << 20;  // 256 MB of float32
  void* a = gpu.Alloc(n * 4);
  void* b = gpu.Alloc(n * 4);
  CUDA_OK(cudaMemset(a, 0, n * 4));
  int polls = 0;
  CHECK_OK(rig.Allreduce({{a, b, n}}, DataType::FLOAT32, ReduceOp::AVERAGE, 1.0, 2.0, &polls));
  std::printf("256 MB average: finished after %d polls\n", polls);
  CHECK(polls > 1);
}

// The executor's primitives on the GPU (pack, scale, unpack around a plane
// call) and its fence.
void TestExecutorPrimitives(Rig& rig) {
  Executor& ex = *rig.executor;
  for (DataType dtype : kDtypes) {
    Gpu gpu;
    const int64_t n = 513;
    const std::vector<char> a = HostValues(dtype, n, 1), b = HostValues(dtype, n, 2);
    const int64_t bytes = static_cast<int64_t>(a.size());
    void* da = gpu.Upload(a);
    void* db = gpu.Upload(b);
    char* f = static_cast<char*>(ex.FusionBuffer(2 * bytes + 8));
    CHECK(f != nullptr);
    CHECK_OK(ex.Copy(f, da, bytes));
    CHECK_OK(ex.Zero(f + bytes, 8));
    CHECK_OK(ex.Copy(f + bytes + 8, db, bytes));
    CHECK_OK(ex.Scale(f, 2 * n + 8 / DataTypeSize(dtype), dtype, 1.5));
    CHECK_OK(ex.FinishReduction(f, 2 * n + 8 / DataTypeSize(dtype), dtype, ReduceOp::AVERAGE, 0.5,
                                3));
    void* out = gpu.Alloc(bytes);
    CHECK_OK(ex.Copy(out, f + bytes + 8, bytes));
    CHECK_OK(WaitEvent(ex.Fence()));
    std::vector<char> want = b;
    ScaleBuffer(want.data(), n, dtype, 1.5);
    FinishReduction(want.data(), n, dtype, ReduceOp::AVERAGE, 0.5, 3);
    CHECK(SameValues(gpu.Download(out, bytes), want, dtype, n, "executor primitives"));
    const std::vector<char> zeros = gpu.Download(f + bytes, 8);
    CHECK(zeros == std::vector<char>(8, 0));
  }
}

// A real NCCL error (a root that is not a rank) comes back as a typed Status
// with NCCL's own text.
void TestRealNcclError(NcclApi* api, cudaStream_t stream) {
  auto abort = std::make_shared<NcclAbortFlag>();
  NcclCommunicators comms(api, abort);
  NcclComm comm = nullptr;
  CHECK_OK(comms.Get(99, 0, 0, 1, kAlone, &comm));
  Gpu gpu;
  void* buf = gpu.Alloc(64);
  NcclResult r = api->Broadcast(buf, buf, 64, /*root=*/5, comm, stream);
  if (r == NcclResult::kInProgress) {
    Status s = comms.WaitReady(comm, "ncclBroadcast", std::chrono::seconds(10));
    std::printf("ncclBroadcast(root 5) returned ncclInProgress, then: %s\n", s.message().c_str());
    CHECK(s.code() == StatusCode::INVALID_ARGUMENT);
    return;
  }
  Status s = NcclResultToStatus(r, "ncclBroadcast", api->ErrorString(r), api->LastError(comm));
  std::printf("ncclBroadcast(root 5): %s\n", s.message().c_str());
  CHECK(r == NcclResult::kInvalidArgument);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(Contains(s.message(), "ncclInvalidArgument"));
  CHECK(Contains(s.message(), "ncclBroadcast"));
  CHECK(Contains(s.message(), api->ErrorString(r)));

  // Observation, not a check: does this thread still form a working
  // communicator after NCCL rejected a call on it? (With NCCL 2.28.9 a
  // communicator formed after such an error on the same thread was seen
  // uninitialised, which is why the plane validates arguments itself.)
  NcclCommunicators after(api, std::make_shared<NcclAbortFlag>());
  NcclDataPlane plane(&after, 12, 0, 1, kAlone);
  GpuCompletion done;
  Status again = plane.Allreduce(0, stream, buf, buf, 16, DataType::FLOAT32, ReduceOp::SUM,
                                 &done);
  if (again.ok()) again = Wait(plane, &done);
  std::printf("same thread, new communicator after the NCCL error: %s\n",
              again.ok() ? "works" : again.message().c_str());

}

// Rank 0 of a two-rank communicator whose rank 1 never comes: without the
// abort flag (or the timeout) ncclCommInitRank would wait forever. Each case
// runs on its own thread, as NCCL keeps group state per thread.
void TestDeadPeerAborts(NcclApi* api) {
  std::thread flag_case([api] {
    auto abort = std::make_shared<NcclAbortFlag>();
    NcclCommunicators comms(api, abort, std::chrono::minutes(5));
    NcclDataPlane plane(&comms, 7, 0, 2, kAlone);
    std::thread killer([abort] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      abort->Request("rank 1 of process set 7 died");
    });
    const auto start = std::chrono::steady_clock::now();
    GpuCompletion done;
    char* dummy = nullptr;
    Status s = plane.Broadcast(0, nullptr, dummy, dummy, 0, 0, &done);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    killer.join();
    std::printf("dead peer (abort flag): %.2f s: %s\n", secs, s.message().c_str());
    CHECK(s.code() == StatusCode::ABORTED);
    CHECK(Contains(s.message(), "rank 1 of process set 7 died"));
    CHECK(secs >= 0.9 && secs < 30);
    CHECK(comms.size() == 0);
  });
  flag_case.join();
  std::thread timeout_case([api] {
    auto abort = std::make_shared<NcclAbortFlag>();
    NcclCommunicators comms(api, abort, std::chrono::seconds(2));
    NcclComm comm = nullptr;
    const auto start = std::chrono::steady_clock::now();
    Status s = comms.Get(8, 0, 0, 2, kAlone, &comm);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("dead peer (timeout): %.2f s: %s\n", secs, s.message().c_str());
    CHECK(s.code() == StatusCode::ABORTED);
    CHECK(Contains(s.message(), "did not finish"));
    CHECK(secs >= 1.9 && secs < 30);
    CHECK(comms.size() == 0);
  });
  timeout_case.join();
}

// After the aborts, this thread still forms and uses a new communicator.
void TestFreshCommunicator(NcclApi* api, cudaStream_t stream) {
  auto abort = std::make_shared<NcclAbortFlag>();
  NcclCommunicators comms(api, abort);
  NcclDataPlane plane(&comms, 11, 0, 1, kAlone);
  Gpu gpu;
  const std::vector<char> in = HostValues(DataType::FLOAT32, 100, 3);
  void* buf = gpu.Upload(in);
  GpuCompletion done;
  CHECK_OK(plane.Allreduce(0, stream, buf, buf, 100, DataType::FLOAT32, ReduceOp::SUM, &done));
  CHECK_OK(Wait(plane, &done));
  CHECK(gpu.Download(buf, in.size()) == in);
}

}  // namespace

int main() {
  // Progress survives a kill by the test's timeout.
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU 0: %s (%d devices)\n", prop.name, devices);
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::unique_ptr<NcclApi> api = CreateCudaNcclApi();
  auto abort = std::make_shared<NcclAbortFlag>();
  {
    NcclCommunicators comms(api.get(), abort);
    NcclDataPlane plane(&comms, 0, 0, 1, kAlone);
    Rig rig(api.get(), &comms, &plane);
    TestAllreduce(rig);
    std::printf("allreduce: %d checks, %d failed\n", g_checks, g_failures);
    TestFusedAllreduce(rig, /*grouped=*/false);
    TestFusedAllreduce(rig, /*grouped=*/true);
    std::printf("fused allreduce: %d checks, %d failed\n", g_checks, g_failures);
    TestOtherCollectives(rig, stream);
    std::printf("allgather/broadcast/alltoall/reducescatter: %d checks, %d failed\n", g_checks,
                g_failures);
    TestAsynchronousCompletion(rig);
    TestExecutorPrimitives(rig);
    std::printf("executor primitives: %d checks, %d failed\n", g_checks, g_failures);
    CHECK(comms.size() == 1);  // one communicator for (set 0, GPU 0), reused
  }
  // On its own thread: NCCL keeps group state per thread.
  std::thread error_case([&api, stream] { TestRealNcclError(api.get(), stream); });
  error_case.join();
  TestDeadPeerAborts(api.get());
  TestFreshCommunicator(api.get(), stream);
  cudaStreamDestroy(stream);
  return CheckExitCode();
}
