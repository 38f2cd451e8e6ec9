#include "in_flight.h"

#include <chrono>
#include <thread>

namespace tfring {

void InFlight::Add(std::unique_ptr<DeviceEvent> done, Finish finish) {
  ops_.push_back({std::move(done), std::move(finish)});
}

int InFlight::Poll() {
  // Finished collectives are taken out before their callbacks run, so a
  // callback that submits new work never sees a half-updated list.
  std::vector<std::pair<Finish, Status>> finished;
  for (auto it = ops_.begin(); it != ops_.end();) {
    Status s = it->done->Query();
    if (s.in_progress()) {
      ++it;
      continue;
    }
    finished.push_back({std::move(it->finish), s});
    it = ops_.erase(it);
  }
  for (auto& f : finished) f.first(f.second);
  return static_cast<int>(finished.size());
}

void InFlight::Drain(double timeout_s, const Status& abandoned) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!ops_.empty() && std::chrono::steady_clock::now() < deadline) {
    if (Poll() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::vector<Op> left;
  left.swap(ops_);
  for (auto& op : left) op.finish(abandoned);
}

}  // namespace tfring
