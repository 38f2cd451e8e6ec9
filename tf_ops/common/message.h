// Messages exchanged during negotiation. A rank sends a RequestList (the
// tensors it has become ready to reduce since the last cycle) to the
// coordinator; the coordinator answers every rank with one ResponseList (what
// to run, in which order). Both travel as flat byte strings.
#ifndef TFRING_COMMON_MESSAGE_H
#define TFRING_COMMON_MESSAGE_H

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common.h"
#include "status.h"

namespace tfring {

struct Request {
  int32_t request_rank = 0;
  CollectiveType type = CollectiveType::ALLREDUCE;
  DataType dtype = DataType::FLOAT32;
  std::string name;
  int32_t root_rank = 0;  // BROADCAST: job-wide rank, as the user gave it
  ReduceOp reduce_op = ReduceOp::SUM;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  TensorShape shape;
  // ALLTOALL: rows sent to each rank. ADD_PROCESS_SET: the member ranks.
  std::vector<int64_t> splits;
  // Grouped collectives: every member shares group_name and is run together.
  std::string group_name;
  int32_t group_size = 0;
  int32_t group_index = 0;
  // Where the tensor lives on the requesting rank (kCpuDevice or a GPU ordinal).
  int32_t device = kCpuDevice;
  // ALLGATHER, ALLTOALL: the caller fixed its output's size before
  // negotiation (an XLA-compiled step has static shapes) by assuming every
  // rank sends as many rows as this one; negotiation fails the collective on
  // every rank when they do not.
  bool same_rows = false;
  // Non-empty: this rank raised before it could submit the collective (a
  // bad argument of its own), and why. The coordinator fails the collective
  // on every rank once the others have submitted it, naming this rank,
  // instead of leaving them to wait for a submission that never comes.
  std::string abandoned;

  bool operator==(const Request& o) const;
};

// Storage of finished requests, reused by new ones. A Request holds heap
// vectors (its shape, its splits), so making one per submission
// (TensorTableEntry::ToRequest) was an allocation per collective. Where a
// request's life ends in the steady state (a speculated response that every
// rank agreed on, Speculation::Result) it is given back here, and the next
// submission is copied into its storage. Thread-safe: submitting threads
// take, the thread driving the set gives back. Bounded: a burst of
// submissions allocates beyond it as before.
class RequestPool {
 public:
  RequestPool();
  // A copy of `from`, in a spare's storage when one is there.
  Request Copy(const Request& from);
  // Keeps `done`'s storage for a later Copy (or drops it when full).
  void Give(Request&& done);

 private:
  static constexpr size_t kMaxSpares = 1024;
  std::mutex mu_;
  std::vector<Request> spares_;  // capacity kMaxSpares from the start
};

// The process's one pool (requests move between process sets' queues and
// controllers on several threads, and never outlive the process).
RequestPool& SpareRequests();

struct RequestList {
  std::vector<Request> requests;
  // This rank asks the job to shut down (shutdown() or interpreter exit).
  bool shutdown = false;
  std::string shutdown_reason;
  // The shutdown's kind (a FailureCause: SHUTDOWN, or TIMEOUT for a stall)
  // and the rank that asked for it.
  int32_t shutdown_cause = 0;
  int32_t shutdown_rank = -1;
};

enum class ResponseType : int32_t {
  COLLECTIVE = 0,  // run `collective` on `tensor_names`
  ERROR = 1,       // fail `tensor_names` on every rank with `error_message`
};

struct Response {
  ResponseType type = ResponseType::COLLECTIVE;
  CollectiveType collective = CollectiveType::ALLREDUCE;
  std::vector<std::string> tensor_names;
  std::string error_message;
  // ERROR: why, so every rank raises the same cause: MISMATCH when ranks
  // disagree, INVALID_ARGUMENT when what they agree on is itself bad (a root
  // outside the set, splits that do not fit, a scalar to gather).
  FailureCause error_cause = FailureCause::MISMATCH;
  DataType dtype = DataType::FLOAT32;
  ReduceOp reduce_op = ReduceOp::SUM;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  int32_t root_rank = 0;  // BROADCAST: the root's rank within the process set
  // ALLREDUCE: element count of each tensor (lets a joined rank contribute
  // zeros). ALLGATHER: first-dimension size of each tensor on each rank,
  // tensor-major. ALLTOALL: the size x size split matrix, sender-major.
  std::vector<int64_t> tensor_sizes;
  // JOIN: the last rank that joined. ADD_PROCESS_SET: the new set's id.
  int32_t int_result = -1;
  // ADD/REMOVE_PROCESS_SET: the member ranks / the id being removed.
  std::vector<int64_t> ranks;
  // COLLECTIVE: the device of the tensors on each set rank (index = set
  // rank). Ranks agree on CPU vs GPU but may use different GPU ordinals; a
  // fused response has the same devices for all of its tensors. Empty for
  // errors and join.
  std::vector<int32_t> devices;
  // Local to this rank, never sent: the controller scheduled this response
  // without negotiation (controller.h, speculation), so its data-plane call
  // carries the divergence flag; `diverged`: this rank raises it.
  bool speculative = false;
  bool diverged = false;

  // The device this set rank runs the response on (CPU when none is recorded).
  int32_t device_of(int set_rank) const {
    return set_rank >= 0 && set_rank < static_cast<int>(devices.size()) ? devices[set_rank]
                                                                        : kCpuDevice;
  }
  bool operator==(const Response& o) const;
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;
  std::string shutdown_reason;
  int32_t shutdown_cause = 0;  // as in RequestList
  int32_t shutdown_rank = -1;
  // Autotune: new values every rank applies after this cycle.
  bool has_params = false;
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  int64_t shm_min_bytes = 0;
};

std::string SerializeRequestList(const RequestList& list);
Status ParseRequestList(const std::string& bytes, RequestList* list);
std::string SerializeResponseList(const ResponseList& list);
Status ParseResponseList(const std::string& bytes, ResponseList* list);

}  // namespace tfring

#endif  // TFRING_COMMON_MESSAGE_H
