// `_tfring_core`: the core's collectives on raw buffers, for Python without
// TensorFlow (tfring/core/). Like the TF kernels (tf_ops/tensorflow/
// kernels.cc) it only translates: it fills one TensorTableEntry per tensor
// and hands it to the same Enqueue. What the collective checks, negotiates
// and runs is decided in the core, never here.
//
// Threads: Enqueue runs with the GIL released; the core's background thread
// takes the GIL only to call a Python output allocator, and to drop the
// Python objects a request kept alive when Python let go of the request
// before it ended. Waiting on a handle releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../common/gpu_support.h"
#include "../common/operations.h"
#include "../python_lifecycle.h"

namespace py = pybind11;

namespace tfring {
namespace {

// Gives a core thread (one Python did not start) one Python thread state
// for its whole life, before it first takes the GIL. Without it every
// gil_scoped_acquire there made a thread state and deleted it again, which
// left ~150 bytes behind per call (issue 40: an allgather's output allocator
// runs on the background thread whenever a process set was added) and cost
// a few microseconds. The state is the interpreter's to clear at exit.
void KeepPythonThreadState() {
  thread_local bool kept = false;
  if (kept) return;
  kept = true;
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() != nullptr) return;
  PyGILState_Ensure();
  PyEval_SaveThread();
}

// A Python object referenced from C++ state that the core's threads may
// destroy: the reference is dropped under the GIL, and leaked instead when
// the interpreter is already gone (a request failed during exit).
class PyRef {
 public:
  explicit PyRef(py::object o) : obj_(o.release().ptr()) {}
  ~PyRef() {
    if (obj_ == nullptr || !Py_IsInitialized()) return;
    KeepPythonThreadState();
    py::gil_scoped_acquire gil;
    Py_DECREF(obj_);
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
  explicit PendingCall(int entries) : remaining_(entries), received_splits_(entries) {}

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
  int remaining_;
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

Status CheckEnum(int32_t value, int32_t last, const char* what) {
  if (value < 0 || value > last) {
    return Status::InvalidArgument("tfring: " + std::string(what) + " " + std::to_string(value) +
                                   " is not one the core knows");
  }
  return Status::OK();
}

// Calls the Python allocator (allocator(index, shape) -> data pointer) on
// whichever core thread needs the output.
AllocateFn PythonAllocator(std::shared_ptr<PyRef> allocator, int index) {
  return [allocator, index](const TensorShape& shape, void** data) {
    KeepPythonThreadState();
    py::gil_scoped_acquire gil;
    try {
      py::tuple dims(shape.size());
      for (size_t i = 0; i < shape.size(); ++i) dims[i] = py::int_(shape[i]);
      py::object result = py::reinterpret_borrow<py::object>(allocator->get())(index, dims);
      *data = reinterpret_cast<void*>(result.cast<uintptr_t>());
    } catch (py::error_already_set& e) {
      return Status::Unknown("tfring: allocating an output of shape " + ShapeString(shape) +
                             " failed: " + e.what());
    } catch (const std::exception& e) {
      return Status::Unknown("tfring: the output allocator returned no data pointer: " +
                             std::string(e.what()));
    }
    return Status::OK();
  };
}

// Fills entry `i` of `call` (all but the callback).
// `allocate` makes outputs of unknown size (empty: there is no allocator).
Status FillEntry(const CallSpec& call, const TensorSpec& t, int i, int n,
                 const std::shared_ptr<DeviceEvent>& ready, AllocateFn allocate,
                 const std::shared_ptr<PendingCall>& req, TensorTableEntry* e) {
  e->type = static_cast<CollectiveType>(call.collective);
  if (n > 1 || call.grouped) {
    e->name = call.name + "_" + std::to_string(i);
  } else {
    e->name = call.name;
  }
  if (call.grouped) {
    e->group_name = call.name;
    e->group_size = n;
    e->group_index = i;
  }
  TFRING_RETURN_IF_ERROR(CheckEnum(t.dtype, static_cast<int32_t>(DataType::BOOL), "dtype"));
  e->dtype = static_cast<DataType>(t.dtype);
  e->shape = t.shape;
  e->device = call.device;
  e->ready_event = ready;
  e->input = reinterpret_cast<const void*>(t.input);
  e->reduce_op = static_cast<ReduceOp>(call.reduce_op);
  e->prescale_factor = call.prescale;
  e->postscale_factor = call.postscale;
  e->root_rank = call.root_rank;
  switch (e->type) {
    case CollectiveType::ALLREDUCE:
    case CollectiveType::BROADCAST:
      if (t.output == 0) {
        return Status::InvalidArgument(std::string("tfring: ") + CollectiveName(e->type) +
                                       " needs an output buffer of the input's shape");
      }
      e->output = reinterpret_cast<void*>(t.output);
      break;
    case CollectiveType::ALLTOALL:
      e->splits = call.splits;
      e->set_received_splits = [req, i](const std::vector<int64_t>& received) {
        req->SetReceivedSplits(i, received);
      };
      [[fallthrough]];
    case CollectiveType::ALLGATHER:
    case CollectiveType::REDUCESCATTER:
      if (!allocate) {
        return Status::InvalidArgument(std::string("tfring: ") + CollectiveName(e->type) +
                                       " needs an output allocator");
      }
      e->allocate_output = std::move(allocate);
      break;
    default:
      return Status::InvalidArgument(std::string("tfring: ") + CollectiveName(e->type) +
                                     " is not submitted through enqueue()");
  }
  return Status::OK();
}

// Submits `tensors` as one call; the returned request finishes when all
// have. A submission error finishes the request at once with that error
// (entries already enqueued still run to their end first).
// The ready event of a GPU call, recorded by ready_event() before the
// outputs are made (null for host memory).
struct ReadyEvent {
  std::shared_ptr<DeviceEvent> event;
};

std::shared_ptr<PendingCall> Submit(const CallSpec& call, const std::vector<TensorSpec>& tensors,
                                    std::shared_ptr<DeviceEvent> ready, py::object allocator,
                                    py::object keep_alive) {
  const int n = static_cast<int>(tensors.size());
  auto req = std::make_shared<PendingCall>(std::max(n, 1));
  req->KeepAlive(std::make_shared<PyRef>(py::make_tuple(keep_alive, allocator)));
  auto alloc = allocator.is_none() ? nullptr : std::make_shared<PyRef>(allocator);
  py::gil_scoped_release release;
  Status s = CheckEnum(call.collective, static_cast<int32_t>(CollectiveType::REDUCESCATTER),
                       "collective");
  if (s.ok()) s = CheckEnum(call.reduce_op, static_cast<int32_t>(ReduceOp::PRODUCT), "reduce op");
  if (s.ok() && n == 0) s = Status::InvalidArgument("tfring: no tensors were given");
  if (s.ok()) s = CheckInitialized();
  if (s.ok() && IsGpuDevice(call.device) && !ready) {
    // One event for the whole call: every input was produced on `stream`.
    s = RecordReadyEvent(call.device, reinterpret_cast<void*>(call.stream), &ready);
  }
  if (!s.ok()) {
    req->SetSubmitStatus(s);
    req->Finish(s, -1, std::max(n, 1));
    return req;
  }
  for (int i = 0; i < n; ++i) {
    TensorTableEntry e;
    s = FillEntry(call, tensors[i], i, n, ready, alloc ? PythonAllocator(alloc, i) : AllocateFn(),
                  req, &e);
    if (!s.ok()) {
      // Enqueue abandons an entry whose arguments it rejects; one rejected
      // here is abandoned alike, so the other ranks do not wait for it.
      Abandon(call.process_set_id, e, s);
    } else {
      e.callback = [req](const Status& st, int32_t) { req->Finish(st); };
      s = Enqueue(call.process_set_id, std::move(e));
    }
    if (!s.ok()) {
      req->SetSubmitStatus(s);
      req->Finish(s, -1, n - i);
      break;
    }
  }
  return req;
}

// Names of submit_array() calls, interned: the first call with a name
// copies its text once, and later calls find it by the Python string's
// cached hash (pointer equality first) without converting it again. Bounded,
// so that a job naming every call afresh does not grow it without end;
// past the bound names are converted per call, as before. Touched with the
// GIL held only. Never freed: it lives as long as the module, and freeing a
// dict after the interpreter is gone would crash at exit.
class NameTable {
 public:
  static constexpr size_t kMaxNames = 16384;

  // The text of `name`; `intern`: remember it (a caller's own name, likely
  // to come back), else converted for this call only (a numbered default).
  const std::string& Get(PyObject* name, bool intern, std::string* scratch) {
    if (index_ == nullptr) index_ = PyDict_New();
    PyObject* found = PyDict_GetItemWithError(index_, name);
    if (found != nullptr) return names_[PyLong_AsSsize_t(found)];
    if (PyErr_Occurred()) throw py::error_already_set();
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(name, &size);
    if (text == nullptr) throw py::error_already_set();
    if (!intern || names_.size() >= kMaxNames) {
      scratch->assign(text, size);
      return *scratch;
    }
    py::object index = py::int_(names_.size());
    if (PyDict_SetItem(index_, name, index.ptr()) != 0) throw py::error_already_set();
    names_.emplace_back(text, size);
    return names_.back();
  }
  size_t size() const { return names_.size(); }

 private:
  PyObject* index_ = nullptr;
  std::deque<std::string> names_;  // a deque: references stay valid as it grows
};

NameTable& Names() {
  static NameTable* table = new NameTable();
  return *table;
}

// The core's dtype code of a numpy dtype in native byte order; -1 for one
// the core does not take here (the Python path then names the problem).
int32_t NumpyDtypeCode(const py::dtype& dt) {
  char order = dt.byteorder();
  if (order != '=' && order != '|' && order != (PY_BIG_ENDIAN ? '>' : '<')) return -1;
  const py::ssize_t size = dt.itemsize();
  switch (dt.kind()) {
    case 'b':
      return size == 1 ? static_cast<int32_t>(DataType::BOOL) : -1;
    case 'i':
      return size == 1   ? static_cast<int32_t>(DataType::INT8)
             : size == 2 ? static_cast<int32_t>(DataType::INT16)
             : size == 4 ? static_cast<int32_t>(DataType::INT32)
             : size == 8 ? static_cast<int32_t>(DataType::INT64)
                         : -1;
    case 'u':
      return size == 1   ? static_cast<int32_t>(DataType::UINT8)
             : size == 2 ? static_cast<int32_t>(DataType::UINT16)
                         : -1;
    case 'f':
      return size == 2   ? static_cast<int32_t>(DataType::FLOAT16)
             : size == 4 ? static_cast<int32_t>(DataType::FLOAT32)
             : size == 8 ? static_cast<int32_t>(DataType::FLOAT64)
                         : -1;
    default:
      return -1;
  }
}

// An output numpy array of `shape`, made on the core's thread once the shape
// is negotiated, and kept as the call's result.
AllocateFn NumpyAllocator(std::shared_ptr<PyRef> dtype, std::weak_ptr<PendingCall> call) {
  return [dtype, call](const TensorShape& shape, void** data) {
    KeepPythonThreadState();
    py::gil_scoped_acquire gil;
    try {
      std::vector<py::ssize_t> dims(shape.begin(), shape.end());
      py::array out(py::reinterpret_borrow<py::dtype>(dtype->get()), dims);
      *data = out.mutable_data();
      if (auto req = call.lock()) req->SetResult(std::make_shared<PyRef>(std::move(out)));
    } catch (py::error_already_set& e) {
      return Status::Unknown("tfring: allocating an output of shape " + ShapeString(shape) +
                             " failed: " + e.what());
    }
    return Status::OK();
  };
}

// One collective on one numpy array, submitted in one call from Python: the
// steady-state path of tfring.core's allreduce, broadcast, allgather and
// reducescatter (tfring/core/ops.py). Returns None for an array it does not
// take (not C-contiguous, another dtype, a subclass): Python then goes the
// general way, which copies or names the problem. Returns the core's status
// tuple when the core refused the call, else the PendingCall, whose
// wait_result() gives the output array.
py::object SubmitArray(int32_t collective, py::handle x, py::handle name, bool intern,
                       int32_t process_set_id, int32_t reduce_op, double prescale,
                       double postscale, int32_t root_rank, bool in_place) {
  if (!py::isinstance<py::array>(x)) return py::none();
  auto in = py::reinterpret_borrow<py::array>(x);
  if (!(in.flags() & py::array::c_style)) return py::none();
  if (in_place && !in.writeable()) return py::none();
  py::dtype dt = in.dtype();
  const int32_t code = NumpyDtypeCode(dt);
  if (code < 0) return py::none();
  const auto type = static_cast<CollectiveType>(collective);
  const bool fixed_output = type == CollectiveType::ALLREDUCE || type == CollectiveType::BROADCAST;
  if (!fixed_output && type != CollectiveType::ALLGATHER &&
      type != CollectiveType::REDUCESCATTER) {
    return py::none();
  }
  std::string scratch;
  CallSpec call;
  call.collective = collective;
  call.name = Names().Get(name.ptr(), intern, &scratch);
  call.process_set_id = process_set_id;
  call.reduce_op = reduce_op;
  call.prescale = prescale;
  call.postscale = postscale;
  call.root_rank = root_rank;
  TensorSpec t;
  t.input = reinterpret_cast<uintptr_t>(in.data());
  t.shape.assign(in.shape(), in.shape() + in.ndim());
  t.dtype = code;
  auto req = std::make_shared<PendingCall>(1);
  AllocateFn allocate;
  if (fixed_output) {
    py::array out = in_place ? in : py::array(dt, std::vector<py::ssize_t>(
                                                      in.shape(), in.shape() + in.ndim()));
    t.output = reinterpret_cast<uintptr_t>(out.mutable_data());
    req->SetResult(std::make_shared<PyRef>(out));
    req->KeepAlive(std::make_shared<PyRef>(py::reinterpret_borrow<py::object>(x)));
  } else {
    req->KeepAlive(std::make_shared<PyRef>(py::reinterpret_borrow<py::object>(x)));
    allocate = NumpyAllocator(std::make_shared<PyRef>(dt), req);
  }
  Status s;
  {
    py::gil_scoped_release release;
    s = CheckEnum(reduce_op, static_cast<int32_t>(ReduceOp::PRODUCT), "reduce op");
    if (s.ok()) s = CheckInitialized();
    if (s.ok()) {
      TensorTableEntry e;
      s = FillEntry(call, t, 0, 1, nullptr, std::move(allocate), req, &e);
      if (!s.ok()) {
        Abandon(process_set_id, e, s);
      } else {
        e.callback = [req](const Status& st, int32_t) { req->Finish(st); };
        s = Enqueue(process_set_id, std::move(e));
      }
    }
  }
  if (!s.ok()) {
    req->Finish(s);
    req->ReleaseKeepAlive();
    return StatusTuple(s);
  }
  return py::cast(req);
}

// BARRIER and JOIN: no tensor, one entry.
std::shared_ptr<PendingCall> SubmitControl(CollectiveType type, int32_t process_set_id,
                                       const std::string& name) {
  auto req = std::make_shared<PendingCall>(1);
  py::gil_scoped_release release;
  TensorTableEntry e;
  e.type = type;
  e.name = type == CollectiveType::JOIN ? std::string(kJoinTensorName) : name;
  e.dtype = DataType::UINT8;
  e.callback = [req](const Status& st, int32_t result) { req->Finish(st, result); };
  Status s = CheckInitialized();
  if (s.ok()) s = Enqueue(process_set_id, std::move(e));
  if (!s.ok()) {
    req->SetSubmitStatus(s);
    req->Finish(s);
  }
  return req;
}

}  // namespace
}  // namespace tfring

PYBIND11_MODULE(_tfring_core, m) {
  using namespace tfring;
  m.doc() = "tfring's core without a framework: lifecycle, topology, process sets and "
            "collectives on raw buffers (see tfring.core)";
  DefineLifecycle(m);
  m.def("gpu_built", &GpuBuilt);

  py::class_<PendingCall, std::shared_ptr<PendingCall>>(m, "PendingCall")
      .def("done",
           [](PendingCall& r) {
             bool done;
             {
               py::gil_scoped_release release;
               done = r.Done();
             }
             if (done) r.ReleaseKeepAlive();
             return done;
           })
      .def(
          "wait",
          [](PendingCall& r, double timeout_s) {
            bool done;
            {
              py::gil_scoped_release release;
              done = r.Wait(timeout_s);
            }
            if (done) r.ReleaseKeepAlive();
            return done;
          },
          py::arg("timeout_s") = -1.0)
      .def("status",
           [](PendingCall& r) {
             return StatusTuple(r.status());
           })
      .def("submit_status",
           [](PendingCall& r) {
             return StatusTuple(r.submit_status());
           })
      .def(
          "wait_result",
          [](PendingCall& r) -> py::object {
            // Short slices, so that Ctrl-C reaches the waiting thread.
            for (;;) {
              bool done;
              {
                py::gil_scoped_release release;
                done = r.Wait(0.2);
              }
              if (done) break;
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
            }
            r.ReleaseKeepAlive();
            Status s = r.status();
            if (!s.ok()) return StatusTuple(s);
            auto result = r.result();
            if (!result) return py::none();
            return py::reinterpret_borrow<py::object>(result->get());
          },
          "Waits for a submit_array() call; returns its output array, or the status tuple "
          "(code, message, cause, rank) when it failed.")
      .def("result",
           [](PendingCall& r) -> py::object {
             auto result = r.result();
             if (!result) return py::none();
             return py::reinterpret_borrow<py::object>(result->get());
           })
      .def("int_result", &PendingCall::int_result)
      .def("received_splits", &PendingCall::received_splits);

  py::class_<ReadyEvent>(m, "ReadyEvent");
  m.def(
      "ready_event",
      [](int32_t device, uintptr_t stream) {
        ReadyEvent ev;
        Status s;
        {
          py::gil_scoped_release release;
          s = RecordReadyEvent(device, reinterpret_cast<void*>(stream), &ev.event);
        }
        py::object event = s.ok() ? py::cast(ev) : py::none();
        return StatusTuple(s, event);
      },
      py::arg("device"), py::arg("stream") = 0,
      "(code, message, cause, rank, event): an event recorded now on `stream` (a cudaStream_t as an "
      "integer; 0: the legacy default stream) of GPU `device`, for enqueue(ready_event=...). "
      "A build without GPU support returns INVALID_ARGUMENT.");

  py::class_<TensorSpec>(m, "TensorSpec")
      .def(py::init([](uintptr_t input, uintptr_t output, TensorShape shape, int32_t dtype) {
             return TensorSpec{input, output, std::move(shape), dtype};
           }),
           py::arg("input"), py::arg("output"), py::arg("shape"), py::arg("dtype"));

  m.def(
      "enqueue",
      [](int32_t collective, const std::vector<TensorSpec>& tensors, const std::string& name,
         int32_t process_set_id, bool grouped, int32_t reduce_op, double prescale,
         double postscale, int32_t root_rank, std::vector<int64_t> splits, int32_t device,
         uintptr_t stream, const ReadyEvent* ready, py::object allocator,
         py::object keep_alive) {
        CallSpec call;
        call.collective = collective;
        call.name = name;
        call.process_set_id = process_set_id;
        call.grouped = grouped;
        call.reduce_op = reduce_op;
        call.prescale = prescale;
        call.postscale = postscale;
        call.root_rank = root_rank;
        call.splits = std::move(splits);
        call.device = device;
        call.stream = stream;
        return Submit(call, tensors, ready ? ready->event : nullptr, allocator, keep_alive);
      },
      py::arg("collective"), py::arg("tensors"), py::arg("name"),
      py::arg("process_set_id") = kGlobalProcessSetId, py::arg("grouped") = false,
      py::arg("reduce_op") = static_cast<int32_t>(ReduceOp::SUM), py::arg("prescale") = 1.0,
      py::arg("postscale") = 1.0, py::arg("root_rank") = 0,
      py::arg("splits") = std::vector<int64_t>(), py::arg("device") = kCpuDevice,
      py::arg("stream") = 0, py::arg("ready_event") = nullptr, py::arg("allocator") = py::none(),
      py::arg("keep_alive") = py::none(),
      "Submits one collective over `tensors` (TensorSpec: data pointers, shape, core dtype "
      "code); returns a PendingCall. A GPU call waits for `ready_event` (recorded on `stream` "
      "here when None) before it is negotiated. Outputs of unknown size come from allocator(index, shape) -> "
      "data pointer, called on a core thread with the GIL held. `keep_alive` is held until the "
      "request finishes.");
  m.def("submit_array", &SubmitArray, py::arg("collective"), py::arg("array"), py::arg("name"),
        py::arg("intern"), py::arg("process_set_id"), py::arg("reduce_op"), py::arg("prescale"),
        py::arg("postscale"), py::arg("root_rank"), py::arg("in_place"),
        "One collective on one C-contiguous numpy array in one call (allreduce, broadcast, "
        "allgather, reducescatter): returns a PendingCall (wait_result() gives the output), the "
        "status tuple when the core refused it, or None for an array it does not take.");
  m.def(
      "interned_names", [] { return Names().size(); },
      "How many names submit_array() has interned (each copied once, on its first call).");
  m.def(
      "abandon",
      [](int32_t collective, const std::string& name, int32_t process_set_id, bool grouped,
         int32_t count, const std::string& reason) {
        if (collective < 0 || collective > static_cast<int32_t>(CollectiveType::REDUCESCATTER)) {
          return;
        }
        // The call's first entry, named as FillEntry names it: its failure
        // fails the rest of a group on the other ranks too.
        TensorTableEntry e;
        e.type = static_cast<CollectiveType>(collective);
        e.name = count > 1 || grouped ? name + "_0" : name;
        if (grouped) {
          e.group_name = name;
          e.group_size = count;
        }
        py::gil_scoped_release release;
        Abandon(process_set_id, e, Status::InvalidArgument(reason));
      },
      py::arg("collective"), py::arg("name"), py::arg("process_set_id"), py::arg("grouped"),
      py::arg("count"), py::arg("reason"),
      "Tells the other ranks of the set that this rank raised `reason` instead of submitting "
      "the call `name` (of `count` tensors): they get an error naming this rank rather than "
      "waiting. Nothing is sent when a collective of that name is in flight here.");
  m.def(
      "barrier",
      [](int32_t process_set_id, const std::string& name) {
        return SubmitControl(CollectiveType::BARRIER, process_set_id, name);
      },
      py::arg("process_set_id") = kGlobalProcessSetId, py::arg("name") = "barrier");
  m.def(
      "join",
      [](int32_t process_set_id) {
        return SubmitControl(CollectiveType::JOIN, process_set_id, "");
      },
      py::arg("process_set_id") = kGlobalProcessSetId);
}
