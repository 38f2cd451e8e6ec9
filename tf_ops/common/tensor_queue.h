// The tensors this rank has submitted and not yet completed. Framework
// kernels add entries from their threads; the background thread pops the
// matching requests each cycle and later takes the entries out to run them.
#ifndef TFRING_COMMON_TENSOR_QUEUE_H
#define TFRING_COMMON_TENSOR_QUEUE_H

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common.h"
#include "device_event.h"
#include "message.h"
#include "status.h"

namespace tfring {

// Called exactly once per entry, from the background thread (or from the
// submitting thread when the submission itself fails). int_result carries
// JOIN's last joined rank and ADD_PROCESS_SET's new id.
using DoneCallback = std::function<void(const Status&, int32_t int_result)>;

// Told, on the thread that launched it, that a collective's device work is
// queued: `done` is its fence, which a stream can wait for (QueueWait)
// before the device has finished and the callback has run.
using LaunchedFn = std::function<void(const std::shared_ptr<DeviceEvent>& done)>;

// Allocates an output whose shape is only known after negotiation.
using AllocateFn = std::function<Status(const TensorShape& shape, void** data)>;

// One submitted collective. Its Request part (name, type, dtype, shape,
// device, ...) is what negotiation sees: the entry is a Request, so a new
// request field is declared once and kernels fill it as a field of the entry.
// The rest is what only this rank needs to run it.
struct TensorTableEntry : Request {
  const void* input = nullptr;
  // Preallocated output for collectives whose output has the input's shape
  // (allreduce, broadcast). Others use allocate_output.
  void* output = nullptr;
  AllocateFn allocate_output;
  std::function<void(const std::vector<int64_t>&)> set_received_splits;  // ALLTOALL
  // When the input is not yet written (a GPU kernel's stream may still be
  // producing it), the event that says it is. The executor makes the
  // collective wait for it (Executor::AwaitInput); an event the device
  // cannot wait for also holds the request back from negotiation until it
  // has happened. Null: ready now (host memory).
  std::shared_ptr<DeviceEvent> ready_event;
  DoneCallback callback;
  // Empty, or told when the collective's device work is queued and before
  // it completes (a binding then makes its caller's stream wait for the
  // fence: complete by event). Never called for work that ran on the host,
  // nor for an entry that failed before its launch: only the callback is.
  LaunchedFn launched;

  int64_t input_bytes() const { return NumElements(shape) * DataTypeSize(dtype); }
  // The negotiation message for this entry, sent by set rank `rank`.
  Request ToRequest(int32_t rank) const;
};

class TensorQueue {
 public:
  // Fails (without calling the callback) if `entry.name` is already pending.
  Status Add(TensorTableEntry entry, int32_t rank);
  // Queues `request` (its `abandoned` set) for negotiation without an entry
  // to complete; false, and nothing queued, if its name is pending or
  // already abandoned here. Until the coordinator decides that round
  // (EndAbandoned), a new submission of the name is held back, so that the
  // round's error cannot reach it.
  bool Abandon(Request request);
  // The coordinator's answer for `name` arrived: true if it is the answer to
  // a round this rank abandoned (it is not for the entry now under that
  // name, whose request then goes to negotiation).
  bool EndAbandoned(const std::string& name);
  // Moves out the requests of entries whose input is ready, or whose ready
  // event the device waits for (DeviceEvent::waits_on_device), in submission
  // order; entries still waiting on their ready event stay for a later
  // cycle. An entry whose ready event fails is completed with that error.
  void PopRequests(std::vector<Request>* out);
  // Removes and returns the entry; false if this rank never submitted it.
  bool Take(const std::string& name, TensorTableEntry* entry);
  // The entry's input and output, left in the queue (a speculative run that
  // may be discarded); false if this rank never submitted it.
  bool Peek(const std::string& name, const void** input, void** output) const;
  // Completes every pending entry with `status` (shutdown, fatal error).
  void FailAll(const Status& status);
  std::vector<std::string> PendingNames() const;
  size_t size() const;
  // Whether requests submitted on this rank are not yet negotiated: new, or
  // waiting on their ready event (a device still writing the input).
  bool HasUnannounced() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, TensorTableEntry> table_;
  std::vector<Request> new_requests_;
  // PopRequests' scratch for requests still waiting on their ready event:
  // swapped with new_requests_, so both keep their capacity from cycle to
  // cycle (a fresh vector per cycle was an allocation per collective).
  std::vector<Request> waiting_;
  // Nodes of table_ whose entries were taken, reused by the next Add (a new
  // node was an allocation per collective); emptied of everything an entry
  // keeps alive. At most kSpareNodes.
  static constexpr size_t kSpareNodes = 256;
  std::vector<std::unordered_map<std::string, TensorTableEntry>::node_type> spare_nodes_;
  std::unordered_set<std::string> abandoned_;
  std::vector<Request> held_;  // submitted again while abandoned_
};

}  // namespace tfring

#endif  // TFRING_COMMON_TENSOR_QUEUE_H
