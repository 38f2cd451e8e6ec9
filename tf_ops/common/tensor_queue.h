// The tensors this rank has submitted and not yet completed. Framework
// kernels add entries from their threads; the background thread pops the
// matching requests each cycle and later takes the entries out to run them.
#ifndef TFRING_COMMON_TENSOR_QUEUE_H
#define TFRING_COMMON_TENSOR_QUEUE_H

#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "message.h"
#include "status.h"

namespace tfring {

// Called exactly once per entry, from the background thread (or from the
// submitting thread when the submission itself fails). int_result carries
// JOIN's last joined rank and ADD_PROCESS_SET's new id.
using DoneCallback = std::function<void(const Status&, int32_t int_result)>;

// Allocates an output whose shape is only known after negotiation.
using AllocateFn = std::function<Status(const TensorShape& shape, void** data)>;

struct TensorTableEntry {
  std::string name;
  CollectiveType type = CollectiveType::ALLREDUCE;
  DataType dtype = DataType::FLOAT32;
  TensorShape shape;
  const void* input = nullptr;
  // Preallocated output for collectives whose output has the input's shape
  // (allreduce, broadcast). Others use allocate_output.
  void* output = nullptr;
  AllocateFn allocate_output;
  int32_t root_rank = 0;
  ReduceOp reduce_op = ReduceOp::SUM;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  std::vector<int64_t> splits;  // ALLTOALL rows per destination; ADD_PROCESS_SET ranks
  std::function<void(const std::vector<int64_t>&)> set_received_splits;  // ALLTOALL
  std::string group_name;
  int32_t group_size = 0;
  int32_t group_index = 0;
  DoneCallback callback;

  int64_t input_bytes() const { return NumElements(shape) * DataTypeSize(dtype); }
  Request ToRequest(int32_t rank) const;
};

class TensorQueue {
 public:
  // Fails (without calling the callback) if `entry.name` is already pending.
  Status Add(TensorTableEntry entry, int32_t rank);
  void PopRequests(std::vector<Request>* out);
  // Removes and returns the entry; false if this rank never submitted it.
  bool Take(const std::string& name, TensorTableEntry* entry);
  // Completes every pending entry with `status` (shutdown, fatal error).
  void FailAll(const Status& status);
  std::vector<std::string> PendingNames() const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, TensorTableEntry> table_;
  std::vector<Request> new_requests_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_TENSOR_QUEUE_H
