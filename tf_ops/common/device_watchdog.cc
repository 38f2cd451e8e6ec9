#include "device_watchdog.h"

#include <chrono>
#include <cstddef>
#include <pthread.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "peer_monitor.h"

namespace tfring {

namespace {

using Clock = std::chrono::steady_clock;

thread_local bool t_watchdog = false;

// The watchdog looks again at once for this long after the last collective
// finished or arrived, then every kPoll while device work is in flight, and
// not at all once none is: a collective of a few MB ends within tens of
// microseconds, and a caller that waited for one usually submits the next
// within microseconds, while putting this thread to sleep and waking it
// costs as much as the collective. So it stays awake (yielding) for a while
// after the last one, even with nothing held; a collective that waits for a
// slow peer, or a job between steps, does not keep a core busy. This thread
// does nothing else, so neither delays negotiation.
constexpr std::chrono::microseconds kSpin{1000};
constexpr std::chrono::microseconds kPoll{50};

}  // namespace

DeviceWatchdog::~DeviceWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<Op> left;
  left.swap(ops_);
  for (Op& op : left) op.finish(Status::Aborted("tfring: the device watchdog stopped"));
}

bool DeviceWatchdog::OnWatchdogThread() { return t_watchdog; }

void DeviceWatchdog::Arm(Job job) {
  std::lock_guard<std::mutex> lock(mu_);
  job_ = std::move(job);
  failed_ = Status::OK();
}

Status DeviceWatchdog::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

void DeviceWatchdog::Watch(const void* owner, std::shared_ptr<DeviceEvent> done, Finish finish,
                           bool caller_moved_on) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    // The vector keeps its capacity: nothing allocated here in the steady state.
    ops_.push_back(Op{owner, std::move(done), std::move(finish), Status::OK(), caller_moved_on});
    new_work_ = true;
  }
  work_cv_.notify_one();
}

bool DeviceWatchdog::HeldLocked(const void* owner) const {
  for (const Op& op : ops_)
    if (owner == nullptr || op.owner == owner) return true;
  for (const Op& op : finishing_)
    if (owner == nullptr || op.owner == owner) return true;
  return false;
}

bool DeviceWatchdog::Busy(const void* owner) const {
  std::lock_guard<std::mutex> lock(mu_);
  return HeldLocked(owner);
}

void DeviceWatchdog::Drain(const void* owner, double timeout_s, const Status& abandoned) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  // On the watchdog's own thread (a completion that drains) nothing would
  // end the wait.
  if (!t_watchdog) drained_cv_.wait_until(lock, deadline, [&] { return !HeldLocked(owner); });
  std::vector<Op> left;
  for (auto it = ops_.begin(); it != ops_.end();) {
    if (owner == nullptr || it->owner == owner) {
      left.push_back(std::move(*it));
      it = ops_.erase(it);
    } else {
      ++it;
    }
  }
  lock.unlock();
  for (Op& op : left) op.finish(abandoned);
}

bool DeviceWatchdog::SweepLocked(bool* job_failed) {
  bool any = false;
  size_t kept = 0;
  for (size_t i = 0; i < ops_.size(); ++i) {
    Op& op = ops_[i];
    Status s = op.done ? op.done->Query() : Status::OK();
    if (s.in_progress()) {
      if (kept != i) ops_[kept] = std::move(op);
      ++kept;
      continue;
    }
    // After a peer died, work the abort cut short fails with that death
    // (its cause and rank), not with the abort it ran into.
    if (!s.ok() && !failed_.ok()) s = failed_;
    if (!s.ok() && op.caller_moved_on && failed_.ok()) {
      failed_ = s;
      *job_failed = true;
    }
    op.status = s;
    finishing_.push_back(std::move(op));
    any = true;
  }
  ops_.erase(ops_.begin() + static_cast<std::ptrdiff_t>(kept), ops_.end());
  return any;
}

void DeviceWatchdog::CheckPeers(std::unique_lock<std::mutex>* lock) {
  if (!failed_.ok() || !job_.peers) return;
  std::shared_ptr<PeerMonitor> peers = job_.peers;
  lock->unlock();
  // At most one real look per monitor interval; cheap otherwise.
  Status s = peers->Check();
  lock->lock();
  if (s.ok() || !failed_.ok()) return;
  failed_ = s;
  // The device work waiting on the dead peer never ends by itself: aborting
  // it makes its fences happen, and the sweep fails it with `s`.
  FailJob(lock);
}

void DeviceWatchdog::FailJob(std::unique_lock<std::mutex>* lock) {
  const Status why = failed_;
  Job job = job_;
  lock->unlock();
  if (job.abort_device_work) job.abort_device_work(why.message());
  if (job.stop_job) job.stop_job(why);
  lock->lock();
}

void DeviceWatchdog::Run() {
  t_watchdog = true;
  pthread_setname_np(pthread_self(), "tfring-watchdog");
#ifdef __linux__
  // Its short waits (kPoll) must be short: a timed wait otherwise sleeps
  // until the kernel's timer slack (50 us by default) runs out.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
  auto last_progress = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!ops_.empty()) {
      CheckPeers(&lock);
      bool job_failed = false;
      const bool finished = SweepLocked(&job_failed);
      // Before the completions run: a caller that moved on learns of the
      // failure at its next collective, which must not start first.
      if (job_failed) FailJob(&lock);
      if (finished) {
        // Completions run outside the lock: they may submit (and so hand
        // over) new work, or drain.
        lock.unlock();
        for (Op& op : finishing_) {
          op.finish(op.status);
          // What the op held goes now, outside the lock; the owner stays for Busy().
          op.finish = nullptr;
          op.done.reset();
        }
        lock.lock();
        finishing_.clear();
        drained_cv_.notify_all();
      }
      if (finished || new_work_) {
        new_work_ = false;
        last_progress = Clock::now();
        continue;
      }
    }
    if (Clock::now() - last_progress < kSpin) {
      // The next collective, or this one's end, is likely on its way (see kSpin).
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else if (ops_.empty()) {
      work_cv_.wait(lock, [&] { return stop_ || !ops_.empty(); });
      new_work_ = false;
      last_progress = Clock::now();
    } else {
      work_cv_.wait_for(lock, kPoll, [&] { return stop_ || new_work_; });
    }
  }
}

DeviceWatchdog& Watchdog() {
  static DeviceWatchdog* w = new DeviceWatchdog();
  return *w;
}

}  // namespace tfring
