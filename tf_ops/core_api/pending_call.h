// What the binding's submission paths share (core_module.cc's enqueue(),
// array_submit.cc's one-call paths): the state of a submitted call as Python
// holds it, the Python objects the core's threads may drop, and the filling
// of one TensorTableEntry. Internal to the _tfring_core module.
#ifndef TFRING_CORE_API_PENDING_CALL_H
#define TFRING_CORE_API_PENDING_CALL_H

#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../common/operations.h"

namespace tfring {

namespace py = pybind11;

// Gives a core thread (one Python did not start) one Python thread state
// for its whole life, before it first takes the GIL. Without it every
// gil_scoped_acquire there made a thread state and deleted it again, which
// left ~150 bytes behind per call (issue 40: an allgather's output allocator
// runs on the background thread whenever a process set was added) and cost
// a few microseconds. The state is the interpreter's to clear at exit.
inline void KeepPythonThreadState() {
  thread_local bool kept = false;
  if (kept) return;
  kept = true;
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() != nullptr) return;
  PyGILState_Ensure();
  PyEval_SaveThread();
}

// References that core threads let go of: a core thread must not wait for
// the GIL (the submitting Python thread holds it, and every completion
// behind would wait too; under complete by event the watchdog ends most
// device calls after Python has moved on), so it leaves them here, and the
// binding drops them at its next call from Python (ReleaseDroppedRefs).
// The vector keeps its capacity: nothing allocated in the steady state.
struct DroppedRefs {
  std::mutex mu;
  std::vector<PyObject*> refs;
};
inline DroppedRefs& Dropped() {
  static DroppedRefs* d = new DroppedRefs();  // never freed: core threads may outlive exit
  return *d;
}
// With the GIL held: drops what core threads let go of since the last call.
inline void ReleaseDroppedRefs() {
  DroppedRefs& d = Dropped();
  thread_local std::vector<PyObject*> taken;
  // A finalizer run by a drop may call the binding again: the outer drain
  // goes on with what it took, and the rest waits for the next call.
  thread_local bool draining = false;
  if (draining) return;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.refs.empty()) return;
    taken.swap(d.refs);
  }
  draining = true;
  for (PyObject* o : taken) Py_DECREF(o);  // may run Python code: not under the lock
  taken.clear();
  draining = false;
}

// A Python object referenced from C++ state that the core's threads may
// destroy: the reference is dropped at once under the GIL, left for the
// binding's next call when a core thread lets go of it (Dropped), and
// leaked when the interpreter is already gone (a request failed during
// exit).
class PyRef {
 public:
  explicit PyRef(py::object o) : obj_(o.release().ptr()) {}
  ~PyRef() {
    if (obj_ == nullptr || !Py_IsInitialized()) return;
    if (PyGILState_Check()) {
      Py_DECREF(obj_);
      return;
    }
    DroppedRefs& d = Dropped();
    std::lock_guard<std::mutex> lock(d.mu);
    d.refs.push_back(obj_);
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  PyObject* get() const { return obj_; }

 private:
  PyObject* obj_;
};

// The state of one submitted call (one or more entries): finished once every
// entry's callback ran. Shared by the Python handle and the entries'
// callbacks.
class PendingCall {
 public:
  explicit PendingCall(int entries)
      : entries_(entries), remaining_(entries), received_splits_(entries) {}

  // `n` entries finished with `s`; the first error is the request's. Runs on
  // the core's thread, which must not wait for the GIL here: while Python
  // submits the next collective it holds the GIL, and a completion that
  // waited for it held up every collective behind it. So the objects kept
  // alive are dropped by Python (ReleaseKeepAlive), or with the request.
  void Finish(const Status& s, int32_t int_result = -1, int n = 1) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && status_.ok()) status_ = s;
      if (int_result >= 0) int_result_ = int_result;
      remaining_ -= n;
      if (remaining_ > 0) return;
    }
    cv_.notify_all();
  }
  // With the GIL held, once done: the caller's arrays need not outlive the
  // collective any longer.
  void ReleaseKeepAlive() {
    std::shared_ptr<PyRef> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (remaining_ > 0) return;
      drop = std::move(keep_alive_);
    }
  }

  // An entry's device work is queued (TensorTableEntry::launched): `done`
  // is its fence. Runs on the thread that launched it.
  void Launched(const std::shared_ptr<DeviceEvent>& done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fences_.push_back(done);
      if (static_cast<int>(fences_.size()) < entries_) return;
    }
    cv_.notify_all();
  }

  // Complete by event: waits up to `timeout_s` (negative: forever) until
  // every entry's device work is queued or the call has finished, and then,
  // if the device is still at it, makes `stream` (the caller's, a
  // cudaStream_t) wait for the collective there. The host never waits for
  // the device here. Returns false on timeout; `*queued` is the stream
  // wait's own failure (OK when none was needed).
  bool WaitOnStream(double timeout_s, void* stream, Status* queued) {
    std::vector<std::shared_ptr<DeviceEvent>> fences;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [this] {
        return remaining_ <= 0 || static_cast<int>(fences_.size()) >= entries_;
      };
      if (timeout_s < 0) {
        cv_.wait(lock, ready);
      } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready)) {
        return false;
      }
      // Finished on the host: the device has too, and the status says how.
      if (remaining_ <= 0) return true;
      fences = fences_;
    }
    *queued = Status::OK();
    for (size_t i = 0; i < fences.size(); ++i) {
      // Entries fused into one collective share its fence: one wait each.
      if (i > 0 && fences[i] == fences[i - 1]) continue;
      *queued = fences[i]->QueueWait(stream);
      if (!queued->ok()) break;
    }
    return true;
  }

  bool Done() {
    std::lock_guard<std::mutex> lock(mu_);
    return remaining_ <= 0;
  }
  // Waits up to `timeout_s` (negative: forever); true once done.
  bool Wait(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    auto done = [this] { return remaining_ <= 0; };
    if (timeout_s < 0) {
      cv_.wait(lock, done);
      return true;
    }
    return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), done);
  }
  Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  // Why the call could not be submitted (OK when it was): Python raises it
  // at once, as Horovod raises a bad submission in the *_async call itself.
  void SetSubmitStatus(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    submit_status_ = s;
  }
  Status submit_status() {
    std::lock_guard<std::mutex> lock(mu_);
    return submit_status_;
  }
  int32_t int_result() {
    std::lock_guard<std::mutex> lock(mu_);
    return int_result_;
  }
  void SetReceivedSplits(int index, const std::vector<int64_t>& splits) {
    std::lock_guard<std::mutex> lock(mu_);
    received_splits_[index] = splits;
  }
  std::vector<std::vector<int64_t>> received_splits() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_splits_;
  }
  // What must outlive the collective (the caller's arrays, the allocator),
  // released when the last entry finishes.
  void KeepAlive(std::shared_ptr<PyRef> objects) { keep_alive_ = std::move(objects); }
  // The array a submit_array() call gives back (made at submission, or by
  // the core's thread once the output's shape is known).
  void SetResult(std::shared_ptr<PyRef> result) {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(result);
  }
  std::shared_ptr<PyRef> result() {
    std::lock_guard<std::mutex> lock(mu_);
    return result_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int entries_;
  int remaining_;
  // The fences of entries launched on a device (Launched), while the call
  // may still be running there.
  std::vector<std::shared_ptr<DeviceEvent>> fences_;
  Status status_;
  Status submit_status_;
  int32_t int_result_ = -1;
  std::vector<std::vector<int64_t>> received_splits_;
  std::shared_ptr<PyRef> keep_alive_;
  std::shared_ptr<PyRef> result_;
};

// What Python hands over for one tensor of a call.
struct TensorSpec {
  uintptr_t input = 0;
  uintptr_t output = 0;  // 0: allocated through the allocator after negotiation
  TensorShape shape;
  int32_t dtype = 0;
};

// The arguments of one call, shared by all its tensors.
struct CallSpec {
  int32_t collective = 0;
  int32_t process_set_id = kGlobalProcessSetId;
  std::string name;
  bool grouped = false;
  int32_t reduce_op = static_cast<int32_t>(ReduceOp::SUM);
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  std::vector<int64_t> splits;
  int32_t device = kCpuDevice;
  uintptr_t stream = 0;
};

// INVALID_ARGUMENT unless 0 <= value <= last (`what` names the argument).
Status CheckEnum(int32_t value, int32_t last, const char* what);

// Fills entry `i` of the `n` of `call` (all but the callback). `allocate`
// makes outputs of unknown size (empty: there is no allocator); `ready` is
// the inputs' ready event (null for host memory).
Status FillEntry(const CallSpec& call, const TensorSpec& t, int i, int n,
                 const std::shared_ptr<DeviceEvent>& ready, AllocateFn allocate,
                 const std::shared_ptr<PendingCall>& req, TensorTableEntry* e);

// Enqueues entry `e` of `req`, which FillEntry (and a ready event's record)
// left with status `filled`, its callback finishing `req`. An entry refused
// before the core saw it is abandoned, as Enqueue abandons one it rejects,
// so that the set's other ranks do not wait for it. Returns the refusal.
Status EnqueueFilled(int32_t process_set_id, TensorTableEntry e, const Status& filled,
                     const std::shared_ptr<PendingCall>& req);

}  // namespace tfring

#endif  // TFRING_CORE_API_PENDING_CALL_H
