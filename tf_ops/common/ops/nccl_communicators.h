// What the NCCL data plane (nccl_data_plane.h) stands on: NCCL results as
// typed Statuses, the communicators of a process (made per plane and device
// on first use, NCCL's unique id exchanged through a callback; non-blocking,
// so every wait is a poll that also watches an abort flag), and the CUDA
// events that mark a collective's end. GPU executors (gpu_executor.h) use
// them too. All NCCL/CUDA calls go through NcclApi (nccl_api.h), so this
// file needs neither nccl.h nor CUDA headers.
#ifndef TFRING_COMMON_OPS_NCCL_COMMUNICATORS_H
#define TFRING_COMMON_OPS_NCCL_COMMUNICATORS_H

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../common.h"
#include "../status.h"
#include "nccl_api.h"

namespace tfring {

// Broadcasts `*bytes` from rank 0 of the process set to all its members:
// rank 0 passes the bytes to send, the others receive them into `*bytes`.
// The controller provides it (it already talks to the set's ranks).
using BroadcastBytesFn = std::function<Status(std::string* bytes)>;

// An NCCL result as a Status. The Status code is the typed cause:
//   kInvalidArgument, kInvalidUsage      -> INVALID_ARGUMENT (this rank's call was wrong)
//   kRemoteError, kSystemError, kTimeout -> ABORTED (a peer or the network failed)
//   kUnhandledCudaError, kInternalError  -> UNKNOWN
// The message names the call and carries ncclGetErrorString and
// ncclGetLastError's text.
Status NcclResultToStatus(NcclResult result, const std::string& call,
                          const std::string& error_string, const std::string& last_error);
// A CUDA error (non-zero cudaError_t) as a Status (UNKNOWN) with CUDA's text.
Status CudaErrorToStatus(int error, const std::string& call, const std::string& error_string);

// Set by the core when the job is failing (a dead peer, shutdown); read by
// every poll of the NCCL plane.
class NcclAbortFlag {
 public:
  void Request(const std::string& reason);
  // A new job starts (after the communicators of the failed one are gone).
  void Clear();
  bool requested() const { return requested_.load(std::memory_order_acquire); }
  std::string reason() const;

 private:
  std::atomic<bool> requested_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

// The communicators of this process, keyed by (process set id, device).
class NcclCommunicators {
 public:
  // `init_timeout`: how long a communicator may take to form before the wait
  // gives up (and aborts it). The abort flag ends the wait sooner.
  NcclCommunicators(NcclApi* api, std::shared_ptr<NcclAbortFlag> abort,
                    std::chrono::milliseconds init_timeout = std::chrono::minutes(5));
  ~NcclCommunicators();
  NcclCommunicators(const NcclCommunicators&) = delete;
  NcclCommunicators& operator=(const NcclCommunicators&) = delete;

  // The communicator of `set_id` on `device`; created on first use, which is
  // collective over the set's ranks (each calls Get with the same set id).
  Status Get(int32_t set_id, int device, int rank, int size, const BroadcastBytesFn& broadcast,
             NcclComm* comm);
  // The cached communicator, or null (forms none).
  NcclComm Find(int32_t set_id, int device) const;
  // Destroys the communicators of a removed process set (set ids are reused).
  void Remove(int32_t set_id);
  // Aborts every communicator (pending NCCL work ends) and forgets them.
  void AbortAll();
  // Polls every communicator on `device` once: OK, InProgress, or the first
  // async error (that communicator is then aborted). The abort flag aborts
  // everything.
  Status CheckDevice(int device);
  size_t size() const;

  // Waits, polling, until `comm` has finished the call that returned
  // kInProgress. Gives up on the abort flag, an async error or the deadline.
  Status WaitReady(NcclComm comm, const std::string& call, std::chrono::milliseconds timeout);
  // One poll: OK, InProgress, or the communicator's async error (after which
  // the communicator is aborted). The abort flag aborts everything.
  Status CheckAsync(NcclComm comm, const std::string& call);

  NcclApi* api() const { return api_; }
  const std::shared_ptr<NcclAbortFlag>& abort_flag() const { return abort_; }

 private:
  struct Entry {
    NcclComm comm = nullptr;
    int rank = -1;
    int size = 0;
  };
  Status Create(int device, int rank, int size, const BroadcastBytesFn& broadcast, Entry* entry);
  Status AbortedStatus() const;
  void AbortOne(NcclComm comm);

  NcclApi* api_;
  std::shared_ptr<NcclAbortFlag> abort_;
  std::chrono::milliseconds init_timeout_;
  mutable std::mutex mu_;
  std::map<std::pair<int32_t, int>, Entry> comms_;
};

// Completion events are reused: creating one per collective costs more host
// time than a small collective itself.
class GpuEventPool {
 public:
  explicit GpuEventPool(NcclApi* api) : api_(api) {}
  ~GpuEventPool();
  int Acquire(GpuEvent* event);  // CUDA error code
  void Release(GpuEvent event);
  NcclApi* api() const { return api_; }

 private:
  NcclApi* api_;
  std::mutex mu_;
  std::vector<GpuEvent> free_;
};

// A collective in flight: poll it with NcclDataPlane::Poll until it is not
// InProgress. Movable, not copyable; releases its event when destroyed.
class GpuCompletion {
 public:
  GpuCompletion() = default;
  ~GpuCompletion();
  GpuCompletion(GpuCompletion&& other) noexcept;
  GpuCompletion& operator=(GpuCompletion&& other) noexcept;
  GpuCompletion(const GpuCompletion&) = delete;
  GpuCompletion& operator=(const GpuCompletion&) = delete;
  bool pending() const { return event_ != nullptr; }

 private:
  friend class NcclDataPlane;
  void Reset();
  std::shared_ptr<GpuEventPool> pool_;
  GpuEvent event_ = nullptr;
  NcclComm comm_ = nullptr;
  std::string what_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_OPS_NCCL_COMMUNICATORS_H
