// The core's lifecycle, topology and process-set functions for Python
// (python_lifecycle.h). Every call that may wait on the core's locks
// releases the GIL: the core's background thread takes the GIL itself when
// it calls back into Python (the neutral module's output allocators), so
// holding it here while waiting on the core could deadlock.
#include "python_lifecycle.h"

#include <pybind11/stl.h>

#include "common/gpu_support.h"
#include "common/operations.h"
#include "common/transport/registry.h"

namespace py = pybind11;

namespace tfring {

void DefineLifecycle(py::module_& m) {
  m.def("init", [](int64_t fortran_comm) {
    Status s;
    {
      py::gil_scoped_release release;
      TransportArgs args;
      args.fortran_comm = fortran_comm;
      s = StartTransport("mpi", args);
    }
    return StatusTuple(s);
  });
  m.def("mpi_built", []() { return TransportBuilt("mpi"); });
  m.def("init_tcp", []() {
    Status s;
    {
      py::gil_scoped_release release;
      s = StartTransport("tcp", TransportArgs());
    }
    return StatusTuple(s);
  });
  m.def(
      "shutdown",
      [](const std::string& reason) {
        Status s;
        {
          py::gil_scoped_release release;
          s = Shutdown(reason);
        }
        return StatusTuple(s);
      },
      py::arg("reason") = "");
  m.def("communication_broken", &CommunicationBroken);
  m.def("is_initialized", &IsInitialized);
  m.def("check_initialized", []() { return StatusTuple(CheckInitialized()); });
  m.def("check_topology_known", []() { return StatusTuple(CheckTopologyKnown()); });
  m.def("rank", &Rank);
  m.def("size", &Size);
  m.def("local_rank", &LocalRank);
  m.def("local_size", &LocalSize);
  m.def("cross_rank", &CrossRank);
  m.def("cross_size", &CrossSize);
  m.def("is_homogeneous", &IsHomogeneous);
  m.def("mpi_threads_supported", &MPIThreadsSupported);
  m.def("add_process_set", [](const std::vector<int>& ranks) {
    int32_t id = -1;
    Status s;
    {
      py::gil_scoped_release release;
      s = AddProcessSet(ranks, &id);
    }
    return StatusTuple(s, id);
  });
  m.def("remove_process_set", [](int32_t id) {
    Status s;
    {
      py::gil_scoped_release release;
      s = RemoveProcessSet(id);
    }
    return StatusTuple(s);
  });
  m.def("process_set_info", [](int32_t id) {
    int rank = -1;
    std::vector<int> ranks;
    Status s;
    {
      py::gil_scoped_release release;
      s = GetProcessSet(id, &rank, &ranks);
    }
    return StatusTuple(s, rank, ranks);
  });
  m.def("process_set_ids", &ProcessSetIds, py::call_guard<py::gil_scoped_release>());
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    Status s;
    {
      py::gil_scoped_release release;
      s = StartTimeline(path, mark_cycles);
    }
    return StatusTuple(s);
  });
  m.def("stop_timeline", &StopTimeline, py::call_guard<py::gil_scoped_release>());
  m.def("runtime_params", []() {
    RuntimeParams p;
    {
      py::gil_scoped_release release;
      p = GetRuntimeParams();
    }
    py::dict d;
    d["fusion_threshold_bytes"] = p.fusion_threshold_bytes;
    d["cycle_time_ms"] = p.cycle_time_ms;
    d["shm_min_bytes"] = p.shm_min_bytes;
    d["autotune_done"] = p.autotune_done;
    return d;
  });
  m.def("speculation_stats", []() {
    RuntimeParams p;
    {
      py::gil_scoped_release release;
      p = GetRuntimeParams();
    }
    py::dict d;
    d["entered"] = p.speculation.entered;
    d["responses"] = p.speculation.responses;
    d["fallbacks"] = p.speculation.fallbacks;
    d["failures"] = p.speculation.failures;
    d["inline"] = p.inline_responses;
    return d;
  });
  m.def("queued_collectives", &QueuedCollectives, py::call_guard<py::gil_scoped_release>());
  // Copies host staging has made between a GPU and host memory since load
  // (0 while every GPU tensor stays on its GPU).
  m.def("host_staging_copies", &HostStagingCopies);
#ifdef TFRING_WITH_NCCL
  m.attr("nccl_built") = true;
#else
  m.attr("nccl_built") = false;
#endif
}

}  // namespace tfring
