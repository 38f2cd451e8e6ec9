// Events queried instead of waiting on a device. A GPU tensor is produced on
// a framework stream and reduced on a plane's stream; no core thread blocks
// on either: a device stream waits for an input's event (QueueWait), and the
// device watchdog (device_watchdog.h) queries a collective's fence, and a
// binding's stream waits for that fence (TensorTableEntry::launched) instead
// of its host waiting for the watchdog. A CUDA event in a GPU build, nothing
// at all on the CPU (host memory is ready when it is handed over).
#ifndef TFRING_COMMON_DEVICE_EVENT_H
#define TFRING_COMMON_DEVICE_EVENT_H

#include <cstdint>

#include "status.h"

namespace tfring {

// Where an event stands among others. Events recorded on one queue (a
// stream) happen in the order they were recorded, so waiting for the latest
// of them covers the rest: a fused collective of many tensors from one
// framework stream needs one wait, not one per tensor. A null queue: not
// known to be ordered with any other event.
struct EventOrder {
  const void* queue = nullptr;
  uint64_t seq = 0;  // larger: recorded later on `queue`
};

class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // OK once the event has happened, InProgress while it has not, or the
  // device's error (which then fails the collectives waiting on it). Never
  // blocks; called by one thread at a time (the watchdog, for a fence).
  virtual Status Query() = 0;
  // Whether QueueWait can make a device stream wait for this event. A
  // collective whose inputs have such events is negotiated at once, and the
  // device, not the background thread, holds it back until they are written:
  // the launch overlaps the producer's kernels instead of following them.
  // A GPU collective's fence has it too: the caller's stream then waits for
  // the collective on the device, and its host does not.
  virtual bool waits_on_device() const { return false; }
  // Makes the work queued on `stream` (a cudaStream_t on a GPU) after this
  // call wait, on the device, until this event has happened. Never blocks.
  virtual Status QueueWait(void* stream) {
    (void)stream;
    return Status::Unknown("tfring: this event cannot be waited for on a device stream");
  }
  virtual EventOrder order() const { return {}; }
};

}  // namespace tfring

#endif  // TFRING_COMMON_DEVICE_EVENT_H
