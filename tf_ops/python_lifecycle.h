// The core's lifecycle, topology and process-set functions as Python
// functions: one set of definitions shared by the two pybind11 modules that
// front the core, `_tfring_ops` (inside the TF op library) and
// `_tfring_core` (the framework-neutral module, tf_ops/core_api/). Each
// returns (code, message, cause, rank[, value...]); the Python layer above
// turns a non-zero code into its exception type, with the cause and rank.
#ifndef TFRING_PYTHON_LIFECYCLE_H
#define TFRING_PYTHON_LIFECYCLE_H

#include <pybind11/pybind11.h>

#include <utility>

#include "common/status.h"

namespace tfring {

// (code, message, cause, rank, values...): a status with its typed cause and
// failing rank (status.h), then what the call returns.
template <typename... Values>
pybind11::tuple StatusTuple(const Status& s, Values&&... values) {
  return pybind11::make_tuple(static_cast<int>(s.code()), s.message(),
                              static_cast<int>(s.cause()), s.rank(),
                              std::forward<Values>(values)...);
}

// Defines init, init_tcp, shutdown, rank, size, ..., add_process_set,
// timeline and runtime-parameter functions, mpi_built and nccl_built on `m`.
void DefineLifecycle(pybind11::module_& m);

}  // namespace tfring

#endif  // TFRING_PYTHON_LIFECYCLE_H
