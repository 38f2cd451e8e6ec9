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
#include "array_submit.h"
#include "pending_call.h"

namespace py = pybind11;

namespace tfring {

Status CheckEnum(int32_t value, int32_t last, const char* what) {
  if (value < 0 || value > last) {
    return Status::InvalidArgument("tfring: " + std::string(what) + " " + std::to_string(value) +
                                   " is not one the core knows");
  }
  return Status::OK();
}

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

Status EnqueueFilled(int32_t process_set_id, TensorTableEntry e, const Status& filled,
                     const std::shared_ptr<PendingCall>& req) {
  if (!filled.ok()) {
    Abandon(process_set_id, e, filled);
    return filled;
  }
  e.callback = [req](const Status& st, int32_t) { req->Finish(st); };
  if (IsGpuDevice(e.device)) {
    // The callback holds `req` until after this has run: a plain pointer
    // keeps the function small enough to need no allocation of its own.
    PendingCall* call = req.get();
    e.launched = [call](const std::shared_ptr<DeviceEvent>& done) { call->Launched(done); };
  }
  return Enqueue(process_set_id, std::move(e));
}

namespace {

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
  ReleaseDroppedRefs();
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
    s = EnqueueFilled(call.process_set_id, std::move(e), s, req);
    if (!s.ok()) {
      req->SetSubmitStatus(s);
      req->Finish(s, -1, n - i);
      break;
    }
  }
  return req;
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
            ReleaseDroppedRefs();
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
          [](PendingCall& r, py::object stream) -> py::object {
            ReleaseDroppedRefs();
            const bool on_stream = !stream.is_none();
            void* s_ptr = on_stream ? reinterpret_cast<void*>(stream.cast<uintptr_t>()) : nullptr;
            Status queued;
            // Short slices, so that Ctrl-C reaches the waiting thread.
            for (;;) {
              bool ready;
              {
                py::gil_scoped_release release;
                ready = on_stream ? r.WaitOnStream(0.2, s_ptr, &queued) : r.Wait(0.2);
              }
              if (ready) break;
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
            }
            r.ReleaseKeepAlive();
            Status s = r.Done() ? r.status() : queued;
            if (!s.ok()) return StatusTuple(s);
            auto result = r.result();
            if (!result) return py::none();
            return py::reinterpret_borrow<py::object>(result->get());
          },
          py::arg("stream") = py::none(),
          "Waits for a submit_array() or submit_device() call; returns its output array, or the "
          "status tuple (code, message, cause, rank) when it failed. `stream` (a device call's "
          "caller's stream, a cudaStream_t): complete by event, i.e. return once the collective "
          "is queued on its device, with `stream` made to wait for it there; the host does not "
          "wait for the device.")
      .def(
          "wait_on_stream",
          [](PendingCall& r, uintptr_t stream, double timeout_s) -> py::object {
            ReleaseDroppedRefs();
            Status queued;
            bool ready;
            {
              py::gil_scoped_release release;
              ready = r.WaitOnStream(timeout_s, reinterpret_cast<void*>(stream), &queued);
            }
            if (!ready) return py::none();
            if (r.Done()) {
              r.ReleaseKeepAlive();
              return StatusTuple(r.status());
            }
            return StatusTuple(queued);
          },
          py::arg("stream"), py::arg("timeout_s") = -1.0,
          "Complete by event: waits up to `timeout_s` (negative: forever) until the call is "
          "queued on its device or has finished, and makes `stream` (a cudaStream_t) wait for "
          "it there. Returns None on timeout, else the status tuple: the call's own once it "
          "has finished, else that of queueing the wait.")
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
  DefineArraySubmit(m);
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
