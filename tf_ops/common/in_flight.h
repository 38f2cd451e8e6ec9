// Collectives that have started but whose device work has not finished.
//
// Order: the background thread starts every negotiated response in the
// negotiated order, and starting one issues all of its data-plane calls
// (queued, for an asynchronous plane). So every plane sees its collectives in
// the same order on every rank, which is what keeps ranks from deadlocking,
// whatever order they later finish in. Only the wait for the device moves
// here: each started collective leaves an event, polled once per loop
// iteration, and its tensors complete (callbacks run) when the event has
// happened. Nothing here blocks.
//
// Used by the background thread only, so it has no lock.
#ifndef TFRING_COMMON_IN_FLIGHT_H
#define TFRING_COMMON_IN_FLIGHT_H

#include <functional>
#include <memory>
#include <vector>

#include "device_event.h"
#include "status.h"

namespace tfring {

class InFlight {
 public:
  // Completes the collective's tensors with the device's verdict.
  using Finish = std::function<void(const Status&)>;

  void Add(std::unique_ptr<DeviceEvent> done, Finish finish);
  // Queries every collective once and finishes those whose event has
  // happened (OK or failed). Returns how many finished.
  int Poll();
  // At shutdown: polls until everything has finished or `timeout_s` has
  // passed; what is left then finishes with `abandoned`. A GPU plane must
  // abort its pending work first when a peer is gone (so that its events
  // happen), else outputs may still be written after they are given back.
  void Drain(double timeout_s, const Status& abandoned);
  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }

 private:
  struct Op {
    std::unique_ptr<DeviceEvent> done;
    Finish finish;
  };
  std::vector<Op> ops_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_IN_FLIGHT_H
