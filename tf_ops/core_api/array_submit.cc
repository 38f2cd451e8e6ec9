// The one-call submission paths of _tfring_core: one collective on one
// array, read, checked and enqueued in a single call from Python
// (tfring/core/ops.py, _submit_array), which is how most steady-state calls
// arrive. submit_array() takes C-contiguous numpy arrays; submit_device()
// takes GPU arrays described by __cuda_array_interface__ (CuPy, torch).
// Either returns None for an array it does not take, and Python then goes
// the general way (enqueue()), which copies or names the problem.
#include "array_submit.h"

#include <pybind11/numpy.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "../common/gpu_support.h"
#include "../python_lifecycle.h"
#include "pending_call.h"

namespace tfring {
namespace {

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

// The core's dtype code of an array interface's kind ('b', 'i', 'u', 'f',
// as numpy and __cuda_array_interface__ spell it) and item size; -1 for one
// the core does not take here (the general path then names the problem).
int32_t KindCode(char kind, int64_t size) {
  switch (kind) {
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

// The core's dtype code of a numpy dtype in native byte order; -1 otherwise.
int32_t NumpyDtypeCode(const py::dtype& dt) {
  char order = dt.byteorder();
  if (order != '=' && order != '|' && order != (PY_BIG_ENDIAN ? '>' : '<')) return -1;
  return KindCode(dt.kind(), dt.itemsize());
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

// The arguments both one-call paths share, with the name interned (or
// copied into `scratch`, which must outlive the call).
CallSpec OneCall(int32_t collective, py::handle name, bool intern, std::string* scratch,
                 int32_t process_set_id, int32_t reduce_op, double prescale, double postscale,
                 int32_t root_rank) {
  CallSpec call;
  call.collective = collective;
  call.name = Names().Get(name.ptr(), intern, scratch);
  call.process_set_id = process_set_id;
  call.reduce_op = reduce_op;
  call.prescale = prescale;
  call.postscale = postscale;
  call.root_rank = root_rank;
  return call;
}

// The end of both one-call paths: checks the call, fills its one entry,
// records a GPU input's ready event on `call.stream`, and enqueues, with the
// GIL released. Returns the PendingCall, or the status tuple when the core
// refused the call; a refused entry is abandoned, so that the other ranks
// do not wait for it.
py::object EnqueueOne(const CallSpec& call, const TensorSpec& t, AllocateFn allocate,
                      const std::shared_ptr<PendingCall>& req) {
  ReleaseDroppedRefs();
  Status s;
  {
    py::gil_scoped_release release;
    s = CheckEnum(call.reduce_op, static_cast<int32_t>(ReduceOp::PRODUCT), "reduce op");
    if (s.ok()) s = CheckInitialized();
    if (s.ok()) {
      TensorTableEntry e;
      s = FillEntry(call, t, 0, 1, nullptr, std::move(allocate), req, &e);
      if (s.ok() && IsGpuDevice(call.device)) {
        s = RecordReadyEvent(call.device, reinterpret_cast<void*>(call.stream), &e.ready_event);
      }
      s = EnqueueFilled(call.process_set_id, std::move(e), s, req);
    }
  }
  if (!s.ok()) {
    req->Finish(s);
    req->ReleaseKeepAlive();
    return StatusTuple(s);
  }
  return py::cast(req);
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
  CallSpec call = OneCall(collective, name, intern, &scratch, process_set_id, reduce_op, prescale,
                          postscale, root_rank);
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
  return EnqueueOne(call, t, std::move(allocate), req);
}
// The core's dtype code of a __cuda_array_interface__ typestr ("<f4"); -1
// for one this path does not take (a GPU is little-endian).
int32_t TypestrCode(const std::string& t) {
  if (t.size() != 3 || (t[0] != '<' && t[0] != '|') || t[2] < '1' || t[2] > '8') return -1;
  return KindCode(t[1], t[2] - '0');
}

// A GPU array as __cuda_array_interface__ and its `device` describe it.
struct CudaArray {
  uintptr_t data = 0;
  bool read_only = false;
  TensorShape shape;
  int32_t dtype = -1;
  int32_t device = -1;
  bool has_stream = false;  // CAI v3's producer stream, when it names one
  uintptr_t stream = 0;
};

// Reads `x`'s interface; false for an array this path does not take (no
// interface, strides given, an unknown dtype, no integer device ordinal).
// Any Python error raised while reading is cleared: the general path reads
// the array again and raises what it finds.
bool ReadCudaArray(py::handle x, CudaArray* a) {
  try {
    py::object cai = py::getattr(x, "__cuda_array_interface__", py::none());
    if (!py::isinstance<py::dict>(cai)) return false;
    auto d = py::reinterpret_borrow<py::dict>(cai);
    if (!d.contains("shape") || !d.contains("typestr") || !d.contains("data")) return false;
    if (d.contains("strides") && !d["strides"].is_none()) return false;
    auto data = d["data"].cast<py::tuple>();
    if (data.size() != 2) return false;
    a->data = data[0].cast<uintptr_t>();
    a->read_only = data[1].cast<bool>();
    a->dtype = TypestrCode(d["typestr"].cast<std::string>());
    if (a->dtype < 0) return false;
    a->shape.clear();
    for (py::handle n : d["shape"].cast<py::tuple>()) a->shape.push_back(n.cast<int64_t>());
    a->has_stream = d.contains("stream") && !d["stream"].is_none();
    if (a->has_stream) a->stream = d["stream"].cast<uintptr_t>();
    // CuPy's device has .id, torch's .index.
    py::object device = py::getattr(x, "device", py::none());
    for (const char* attr : {"id", "index"}) {
      py::object v = py::getattr(device, attr, py::none());
      if (py::isinstance<py::int_>(v)) {
        a->device = v.cast<int32_t>();
        break;
      }
    }
    return a->device >= 0;
  } catch (py::error_already_set&) {
    return false;
  } catch (py::cast_error&) {
    return false;
  }
}

// One collective on one GPU array in one call from Python (allreduce and
// broadcast, whose output has the input's shape): the GPU counterpart of
// SubmitArray. `out` is the output array (`x` itself in place), made by the
// caller in its own library; `stream` the stream that produced `x` (None:
// the one the interface names). Records the ready event on that stream,
// enqueues, and returns the PendingCall (wait_result() gives `out`), the
// status tuple when the core refused the call, or None for arrays it does
// not take (Python then goes the general way).
py::object SubmitDevice(int32_t collective, py::handle x, py::handle out, py::object stream,
                        py::handle name, bool intern, int32_t process_set_id, int32_t reduce_op,
                        double prescale, double postscale, int32_t root_rank) {
  const auto type = static_cast<CollectiveType>(collective);
  if (type != CollectiveType::ALLREDUCE && type != CollectiveType::BROADCAST) return py::none();
  CudaArray in, res;
  if (!ReadCudaArray(x, &in)) return py::none();
  if (out.is(x)) {
    res = in;
  } else if (!ReadCudaArray(out, &res)) {
    return py::none();
  }
  // An empty array has no data pointer to give the core.
  if (in.data == 0 || res.data == 0) return py::none();
  if (res.read_only || res.dtype != in.dtype || res.shape != in.shape ||
      res.device != in.device) {
    return py::none();
  }
  if (!stream.is_none()) {
    in.stream = stream.cast<uintptr_t>();
  } else if (!in.has_stream) {
    return py::none();  // which stream produced it is the general path's to find out
  }
  std::string scratch;
  CallSpec call = OneCall(collective, name, intern, &scratch, process_set_id, reduce_op, prescale,
                          postscale, root_rank);
  call.device = in.device;
  call.stream = in.stream;
  TensorSpec t;
  t.input = in.data;
  t.output = res.data;
  t.shape = in.shape;
  t.dtype = in.dtype;
  auto req = std::make_shared<PendingCall>(1);
  req->SetResult(std::make_shared<PyRef>(py::reinterpret_borrow<py::object>(out)));
  req->KeepAlive(std::make_shared<PyRef>(py::reinterpret_borrow<py::object>(x)));
  return EnqueueOne(call, t, AllocateFn(), req);
}

}  // namespace

void DefineArraySubmit(py::module_& m) {
  m.def("submit_array", &SubmitArray, py::arg("collective"), py::arg("array"), py::arg("name"),
        py::arg("intern"), py::arg("process_set_id"), py::arg("reduce_op"), py::arg("prescale"),
        py::arg("postscale"), py::arg("root_rank"), py::arg("in_place"),
        "One collective on one C-contiguous numpy array in one call (allreduce, broadcast, "
        "allgather, reducescatter): returns a PendingCall (wait_result() gives the output), the "
        "status tuple when the core refused it, or None for an array it does not take.");
  m.def("submit_device", &SubmitDevice, py::arg("collective"), py::arg("array"), py::arg("out"),
        py::arg("stream"), py::arg("name"), py::arg("intern"), py::arg("process_set_id"),
        py::arg("reduce_op"), py::arg("prescale"), py::arg("postscale"), py::arg("root_rank"),
        "One allreduce or broadcast of one GPU array (__cuda_array_interface__, no strides) "
        "into `out` (the array itself in place) in one call: records the ready event on "
        "`stream` (None: the interface's own) and enqueues. Returns a PendingCall "
        "(wait_result() gives `out`), the status tuple when the core refused it, or None for "
        "arrays it does not take.");
  m.def(
      "interned_names", [] { return Names().size(); },
      "How many names submit_array() and submit_device() have interned (each copied once, on "
      "its first call).");
}

}  // namespace tfring
