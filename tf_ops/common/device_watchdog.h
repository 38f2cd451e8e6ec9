// The one thread per process that owns device completion and device failure
// (issue 38, "complete by event"). Whoever starts a collective on a device
// (the background thread, or a submitting thread that launched it itself)
// hands the watchdog the collective's fence and what completes its
// tensors; the watchdog queries the fences, runs the completions as the
// device finishes them (in the order they were handed over, among those
// finished), and watches for what would leave device work waiting forever:
// an error of the device or of NCCL (the fence's query reports NCCL's
// asynchronous errors) and a dead peer (the job's PeerMonitor). On a dead
// peer it aborts the GPU work (so that every fence happens), fails what it
// holds with the monitor's typed status naming the rank, and tells the
// job to stop. The negotiation loop never polls a device.
//
// The thread starts with the first device work handed over: a job without
// devices never has one. While nothing is in flight it sleeps.
#ifndef TFRING_COMMON_DEVICE_WATCHDOG_H
#define TFRING_COMMON_DEVICE_WATCHDOG_H

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device_event.h"
#include "status.h"

namespace tfring {

class PeerMonitor;

class DeviceWatchdog {
 public:
  // Completes a collective's tensors with the device's verdict.
  using Finish = std::function<void(const Status&)>;

  // What a job gives the watchdog (lifecycle.cc arms it at init).
  struct Job {
    // Finds dead peers (may be null: nobody to watch).
    std::shared_ptr<PeerMonitor> peers;
    // Ends every pending GPU collective (NCCL's communicators aborted), so
    // that the fences waiting on a dead peer happen.
    std::function<void(const std::string& reason)> abort_device_work;
    // Tells the job to stop with `why` (the background loop ends, failing
    // what is queued).
    std::function<void(const Status& why)> stop_job;
  };

  DeviceWatchdog() = default;
  // Stops and joins the thread; what is still held finishes as abandoned.
  ~DeviceWatchdog();
  DeviceWatchdog(const DeviceWatchdog&) = delete;
  DeviceWatchdog& operator=(const DeviceWatchdog&) = delete;

  // A job starts: its peers and hooks, and no failure seen yet.
  void Arm(Job job);
  // Hands over a started collective of `owner` (its process set): `done`
  // happens when the device has finished it. Shared: a binding may hold the
  // same fence to make its stream wait for it (TensorTableEntry::launched).
  // `caller_moved_on`: a caller was told of the launch and may no longer be
  // waiting (complete by event), so a failure of this work on the device
  // fails the job, as a dead peer does: its callers learn it at their next
  // collective, not never. Never blocks on the device.
  void Watch(const void* owner, std::shared_ptr<DeviceEvent> done, Finish finish,
             bool caller_moved_on = false);
  // Whether work of `owner` (any owner: null) is held or completing now.
  bool Busy(const void* owner = nullptr) const;
  // Waits until `owner`'s work has finished or `timeout_s` has passed (a
  // GPU plane must abort its pending work first when a peer is gone, so
  // that its fences happen); what is left then finishes with `abandoned`.
  void Drain(const void* owner, double timeout_s, const Status& abandoned);
  // The failure the watchdog found in this job (OK: none).
  Status failure() const;

  // Whether the calling thread is a watchdog's: completions run there, and
  // a completion that submits again must not drive negotiation on it.
  static bool OnWatchdogThread();

 private:
  struct Op {
    const void* owner;
    std::shared_ptr<DeviceEvent> done;
    Finish finish;
    Status status;  // the verdict, once finished
    bool caller_moved_on;
  };
  void Run();
  // Under mu_: queries every held op once, moves the finished ones into
  // finishing_; returns whether any finished. Sets *job_failed when work
  // whose caller moved on failed (failed_ then holds why).
  bool SweepLocked(bool* job_failed);
  // With mu_ held in *lock (released meanwhile): the job has failed with
  // failed_: abort the device work and tell the job to stop.
  void FailJob(std::unique_lock<std::mutex>* lock);
  bool HeldLocked(const void* owner) const;
  void CheckPeers(std::unique_lock<std::mutex>* lock);

  mutable std::mutex mu_;
  std::condition_variable work_cv_;     // new work, or stop
  std::condition_variable drained_cv_;  // a sweep's completions have run
  std::vector<Op> ops_;                 // in hand-over order
  std::vector<Op> finishing_;           // taken out, completing on the thread
  Job job_;
  Status failed_;
  bool new_work_ = false;  // handed over since the thread last looked
  bool stop_ = false;
  std::thread thread_;
};

// The process's watchdog (never destroyed, as state(): completions may
// still run while the process exits).
DeviceWatchdog& Watchdog();

}  // namespace tfring

#endif  // TFRING_COMMON_DEVICE_WATCHDOG_H
