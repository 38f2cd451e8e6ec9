// The Python face of the core inside the TF op library (lifecycle,
// topology, process sets; python_lifecycle.cc). It lives in the same shared
// object as the TF ops so that both see one coordinator.
// Functions return (code, message, cause, rank[, value...]) and
// tfring/common/status.py turns a non-zero code into the matching tf.errors
// exception, carrying the cause and the failing rank.
#include <pybind11/pybind11.h>

#include "python_lifecycle.h"

PYBIND11_MODULE(_tfring_ops, m) {
  m.doc() = "tfring core: lifecycle, topology and process sets";
  tfring::DefineLifecycle(m);
}
