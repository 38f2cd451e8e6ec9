// The Python face of the core inside the TF op library (lifecycle,
// topology, process sets; python_lifecycle.cc). It lives in the same shared
// object as the TF ops so that both see one coordinator.
// tfring/common/basics.py turns a non-zero status code into the matching
// tf.errors exception.
#include <pybind11/pybind11.h>

#include "python_lifecycle.h"

PYBIND11_MODULE(_tfring_ops, m) {
  m.doc() = "tfring core: lifecycle, topology and process sets";
  tfring::DefineLifecycle(m);
}
