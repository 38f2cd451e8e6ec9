// The Python face of the core (lifecycle, topology, process sets). It lives
// in the same shared object as the TF ops so that both see one coordinator.
// Functions return (code, message, cause, rank[, value...]) and
// tfring/common/status.py turns a non-zero code into the matching tf.errors
// exception, carrying the cause and the failing rank.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <utility>

#include "common/operations.h"
#include "common/transport/entry_points.h"

namespace py = pybind11;

namespace {

template <typename... Values>
py::tuple StatusTuple(const tfring::Status& s, Values&&... values) {
  return py::make_tuple(static_cast<int>(s.code()), s.message(), static_cast<int>(s.cause()),
                        s.rank(), std::forward<Values>(values)...);
}

}  // namespace

PYBIND11_MODULE(_tfring_ops, m) {
  m.doc() = "tfring core: lifecycle, topology and process sets";

  m.def("init", [](int64_t fortran_comm) {
    tfring::Status s;
    {
      py::gil_scoped_release release;
      s = tfring::InitializeMPI(fortran_comm);
    }
    return StatusTuple(s);
  });
  m.def("mpi_built", &tfring::MPIBuilt);
  m.def("init_tcp", []() {
    tfring::Status s;
    {
      py::gil_scoped_release release;
      s = tfring::InitializeTCP();
    }
    return StatusTuple(s);
  });
  m.def(
      "shutdown",
      [](const std::string& reason) {
        tfring::Status s;
        {
          py::gil_scoped_release release;
          s = tfring::Shutdown(reason);
        }
        return StatusTuple(s);
      },
      py::arg("reason") = "");
  m.def("communication_broken", &tfring::CommunicationBroken);
  m.def("is_initialized", &tfring::IsInitialized);
  m.def("check_initialized", []() { return StatusTuple(tfring::CheckInitialized()); });
  m.def("check_topology_known", []() { return StatusTuple(tfring::CheckTopologyKnown()); });
  m.def("rank", &tfring::Rank);
  m.def("size", &tfring::Size);
  m.def("local_rank", &tfring::LocalRank);
  m.def("local_size", &tfring::LocalSize);
  m.def("cross_rank", &tfring::CrossRank);
  m.def("cross_size", &tfring::CrossSize);
  m.def("is_homogeneous", &tfring::IsHomogeneous);
  m.def("mpi_threads_supported", &tfring::MPIThreadsSupported);
  m.def("add_process_set", [](const std::vector<int>& ranks) {
    int32_t id = -1;
    tfring::Status s;
    {
      py::gil_scoped_release release;
      s = tfring::AddProcessSet(ranks, &id);
    }
    return StatusTuple(s, id);
  });
  m.def("remove_process_set", [](int32_t id) {
    tfring::Status s;
    {
      py::gil_scoped_release release;
      s = tfring::RemoveProcessSet(id);
    }
    return StatusTuple(s);
  });
  m.def("process_set_info", [](int32_t id) {
    int rank = -1;
    std::vector<int> ranks;
    tfring::Status s = tfring::GetProcessSet(id, &rank, &ranks);
    return StatusTuple(s, rank, ranks);
  });
  m.def("process_set_ids", &tfring::ProcessSetIds);
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    return StatusTuple(tfring::StartTimeline(path, mark_cycles));
  });
  m.def("stop_timeline", &tfring::StopTimeline);
  m.def("runtime_params", []() {
    tfring::RuntimeParams p = tfring::GetRuntimeParams();
    py::dict d;
    d["fusion_threshold_bytes"] = p.fusion_threshold_bytes;
    d["cycle_time_ms"] = p.cycle_time_ms;
    d["shm_min_bytes"] = p.shm_min_bytes;
    d["autotune_done"] = p.autotune_done;
    return d;
  });
  m.def("speculation_stats", []() {
    tfring::RuntimeParams p = tfring::GetRuntimeParams();
    py::dict d;
    d["entered"] = p.speculation.entered;
    d["responses"] = p.speculation.responses;
    d["fallbacks"] = p.speculation.fallbacks;
    d["failures"] = p.speculation.failures;
    d["inline"] = p.speculation.inline_responses;
    return d;
  });
#ifdef TFRING_WITH_NCCL
  m.attr("nccl_built") = true;
#else
  m.attr("nccl_built") = false;
#endif
}
