// A fake NCCL and CUDA on host memory (ops/nccl_api.h), shared by the unit
// tests of the GPU pieces' logic (nccl_communicators_test.cc,
// nccl_data_plane_test.cc, gpu_executor_test.cc,
// hierarchical_gpu_data_plane_test.cc), which build with
// TFRING_NCCL_PLANE_LOGIC and need no GPU, nccl.h or CUDA: the fake NCCL,
// the controller's id broadcast seen from one rank, and host buffers of
// floats and ints to compare results with.
#ifndef TFRING_COMMON_TESTS_FAKE_NCCL_H
#define TFRING_COMMON_TESTS_FAKE_NCCL_H

#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "../ops/nccl_api.h"
#include "../ops/nccl_communicators.h"
#include "../reduction.h"
#include "check.h"

namespace tfring {
namespace test {

// A fake NCCL + CUDA on host memory. A communicator of `size` ranks acts as
// if every peer held the same data as this rank, so reductions have known
// results (SUM = size * x); point-to-point receives fill their block with
// the byte (peer + 1), so the test can see where each block landed.
class FakeApi : public NcclApi {
 public:
  struct Comm {
    int nranks, rank;
    std::string id;
    bool aborted = false, destroyed = false;
  };

  std::vector<std::string> log;
  std::string next_id = std::string(kNcclUniqueIdBytes, 'u');
  NcclResult id_result = NcclResult::kSuccess;
  NcclResult init_result = NcclResult::kSuccess;
  NcclResult collective_result = NcclResult::kSuccess;
  std::deque<NcclResult> async_results;  // then kSuccess (or `async_forever`)
  bool async_forever_in_progress = false;
  std::deque<EventState> event_states;   // then kDone (kPending: `events_never_happen`)
  // Every event stays pending, as a collective's fence whose kernel waits
  // for a dead peer: only an abort ends the wait (the fence then fails).
  bool events_never_happen = false;
  int stream_wait_result = 0;            // what StreamWaitEvent returns
  int current_device = 0;
  int events_created = 0;
  int async_queries = 0;
  std::vector<Comm*> comms;
  std::map<void*, int64_t> allocations;

  ~FakeApi() override {
    for (Comm* c : comms) delete c;
  }
  Comm* C(NcclComm c) { return static_cast<Comm*>(c); }
  void Log(const std::string& s) { log.push_back(s); }
  bool Logged(const std::string& s) const {
    for (const auto& l : log)
      if (l == s) return true;
    return false;
  }
  int Count(const std::string& prefix) const {
    int n = 0;
    for (const auto& l : log) n += l.compare(0, prefix.size(), prefix) == 0;
    return n;
  }

  NcclResult GetUniqueId(std::string* id) override {
    Log("GetUniqueId");
    if (id_result == NcclResult::kSuccess) *id = next_id;
    return id_result;
  }
  NcclResult CommInitRank(NcclComm* comm, int nranks, const std::string& id, int rank) override {
    Log("CommInitRank " + std::to_string(rank) + "/" + std::to_string(nranks) + " dev " +
        std::to_string(current_device));
    Comm* c = new Comm{nranks, rank, id};
    comms.push_back(c);
    *comm = c;
    return init_result;
  }
  NcclResult CommGetAsyncError(NcclComm, NcclResult* async) override {
    ++async_queries;
    if (!async_results.empty()) {
      *async = async_results.front();
      async_results.pop_front();
    } else {
      *async = async_forever_in_progress ? NcclResult::kInProgress : NcclResult::kSuccess;
    }
    return NcclResult::kSuccess;
  }
  NcclResult CommAbort(NcclComm comm) override {
    Log("CommAbort");
    C(comm)->aborted = true;
    return NcclResult::kSuccess;
  }
  NcclResult CommDestroy(NcclComm comm) override {
    Log("CommDestroy");
    C(comm)->destroyed = true;
    return NcclResult::kSuccess;
  }
  std::string ErrorString(NcclResult r) override {
    return std::string("text of ") + NcclResultName(r);
  }
  std::string LastError(NcclComm) override { return "last error detail"; }
  NcclResult GroupStart() override {
    Log("GroupStart");
    return NcclResult::kSuccess;
  }
  NcclResult GroupEnd() override {
    Log("GroupEnd");
    return NcclResult::kSuccess;
  }

  // recv = op over `n` copies of send.
  void ReduceCopies(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                    int n) {
    const int64_t bytes = count * DataTypeSize(dtype);
    std::vector<char> orig(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
    std::memcpy(recv, orig.data(), bytes);
    for (int i = 1; i < n; ++i) ReduceInto(recv, orig.data(), count, dtype, op);
  }
  NcclResult AllReduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                       NcclComm comm, GpuStream) override {
    Log(std::string("AllReduce ") + ReduceOpName(op) + (send == recv ? " inplace" : " outofplace"));
    if (collective_result != NcclResult::kSuccess) return collective_result;
    ReduceCopies(send, recv, count, dtype, op, C(comm)->nranks);
    return NcclResult::kSuccess;
  }
  NcclResult Reduce(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                    int root, NcclComm comm, GpuStream) override {
    Log("Reduce count " + std::to_string(count) + " root " + std::to_string(root));
    if (root == C(comm)->rank) ReduceCopies(send, recv, count, dtype, op, C(comm)->nranks);
    return NcclResult::kSuccess;
  }
  NcclResult ReduceScatter(const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp op, NcclComm comm, GpuStream) override {
    Log("ReduceScatter " + std::to_string(count));
    ReduceCopies(static_cast<const char*>(send) + C(comm)->rank * count * DataTypeSize(dtype),
                 recv, count, dtype, op, C(comm)->nranks);
    return NcclResult::kSuccess;
  }
  NcclResult AllGather(const void* send, void* recv, int64_t bytes, NcclComm comm,
                       GpuStream) override {
    Log("AllGather " + std::to_string(bytes));
    for (int r = 0; r < C(comm)->nranks; ++r) {
      char* block = static_cast<char*>(recv) + r * bytes;
      if (r == C(comm)->rank) {
        std::memcpy(block, send, bytes);
      } else {
        std::memset(block, r + 1, bytes);
      }
    }
    return NcclResult::kSuccess;
  }
  NcclResult Broadcast(const void*, void*, int64_t bytes, int root, NcclComm,
                       GpuStream) override {
    Log("Broadcast " + std::to_string(bytes) + " root " + std::to_string(root));
    return collective_result;
  }
  NcclResult Send(const void*, int64_t bytes, int peer, NcclComm, GpuStream) override {
    Log("Send " + std::to_string(bytes) + " to " + std::to_string(peer));
    return NcclResult::kSuccess;
  }
  NcclResult Recv(void* buf, int64_t bytes, int peer, NcclComm, GpuStream) override {
    Log("Recv " + std::to_string(bytes) + " from " + std::to_string(peer));
    std::memset(buf, peer + 1, bytes);
    return NcclResult::kSuccess;
  }
  bool SupportsDataType(DataType dtype) const override {
    return dtype != DataType::BOOL && dtype != DataType::INT16 && dtype != DataType::UINT16;
  }

  int GetDevice(int* device) override {
    *device = current_device;
    return 0;
  }
  int SetDevice(int device) override {
    current_device = device;
    return 0;
  }
  int Malloc(void** ptr, int64_t bytes) override {
    Log("Malloc " + std::to_string(bytes));
    *ptr = ::operator new(static_cast<size_t>(bytes));
    allocations[*ptr] = bytes;
    return 0;
  }
  int Free(void* ptr) override {
    Log("Free");
    allocations.erase(ptr);
    ::operator delete(ptr);
    return 0;
  }
  int MemcpyAsync(void* dst, const void* src, int64_t bytes, GpuStream) override {
    Log("Memcpy " + std::to_string(bytes));
    std::memmove(dst, src, bytes);
    return 0;
  }
  int CopyBatch(void* const* dst, const void* const* src, const int64_t* bytes, int n,
                GpuStream) override {
    Log("CopyBatch " + std::to_string(n));
    for (int i = 0; i < n; ++i) std::memmove(dst[i], src[i], bytes[i]);
    return 0;
  }
  int MemsetAsync(void* dst, int value, int64_t bytes, GpuStream) override {
    Log("Memset " + std::to_string(bytes));
    std::memset(dst, value, bytes);
    return 0;
  }
  int EventCreate(GpuEvent* event) override {
    ++events_created;
    *event = reinterpret_cast<GpuEvent>(static_cast<intptr_t>(events_created));
    return 0;
  }
  int EventRecord(GpuEvent, GpuStream) override {
    Log("EventRecord");
    return 0;
  }
  EventState EventQuery(GpuEvent, int* error) override {
    *error = 0;
    if (event_states.empty()) return events_never_happen ? EventState::kPending : EventState::kDone;
    EventState s = event_states.front();
    event_states.pop_front();
    if (s == EventState::kError) *error = 700;
    return s;
  }
  int StreamWaitEvent(GpuStream, GpuEvent event) override {
    Log("StreamWaitEvent " + std::to_string(reinterpret_cast<intptr_t>(event)));
    return stream_wait_result;
  }
  int EventDestroy(GpuEvent) override { return 0; }
  std::string CudaErrorString(int error) override {
    return "cuda error text " + std::to_string(error);
  }
  int Scale(void* dst, const void* src, int64_t count, DataType dtype, double factor,
            GpuStream) override {
    Log("Scale " + std::to_string(factor));
    std::memmove(dst, src, count * DataTypeSize(dtype));
    return ScaleBuffer(dst, count, dtype, factor).ok() ? 0 : 1;
  }
  int Divide(void* buf, int64_t count, DataType dtype, int64_t divisor, GpuStream) override {
    Log("Divide " + std::to_string(divisor));
    return FinishReduction(buf, count, dtype, ReduceOp::AVERAGE, 1.0, static_cast<int>(divisor))
                   .ok()
               ? 0
               : 1;
  }
};

// The controller's broadcast from rank 0, seen from one rank.
struct FakeBroadcast {
  std::string from_root = std::string(kNcclUniqueIdBytes, 'r');  // what non-roots receive
  std::vector<std::string> sent;                                   // what this rank passed in
  Status result = Status::OK();
  int rank = 0;
  BroadcastBytesFn fn() {
    return [this](std::string* bytes) {
      sent.push_back(*bytes);
      if (!result.ok()) return result;
      if (rank != 0) *bytes = from_root;
      return Status::OK();
    };
  }
};

inline std::vector<char> Floats(const std::vector<float>& v) {
  std::vector<char> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
inline std::vector<char> Floats(std::initializer_list<float> v) {
  return Floats(std::vector<float>(v));
}
inline std::vector<char> Ints(std::initializer_list<int32_t> v) {
  std::vector<char> b(v.size() * 4);
  std::memcpy(b.data(), v.begin(), b.size());
  return b;
}

}  // namespace test
}  // namespace tfring

#endif  // TFRING_COMMON_TESTS_FAKE_NCCL_H
