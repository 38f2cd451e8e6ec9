// The Python face of the core inside the TF op library (lifecycle,
// topology, process sets; python_lifecycle.cc). It lives in the same shared
// object as the TF ops so that both see one coordinator.
// Functions return (code, message, cause, rank[, value...]) and
// tfring/common/status.py turns a non-zero code into the matching tf.errors
// exception, carrying the cause and the failing rank.
#include <pybind11/pybind11.h>

#include "common/config.h"
#include "python_lifecycle.h"
#include "tensorflow/xla/xla_support.h"

PYBIND11_MODULE(_tfring_ops, m) {
  m.doc() = "tfring core: lifecycle, topology and process sets";
  tfring::DefineLifecycle(m);
  // Whether the collectives have XLA kernels in this build (the TF wheel's
  // headers decide; tfring/keras/xla.py turns XLA off without them).
  m.def("xla_kernels", []() { return TFRING_XLA_KERNELS != 0; });
  // Whether Keras may compile a DistributedOptimizer's step with XLA: the
  // kernels exist and TFRING_XLA (read with the other settings) allows it.
  m.def("xla_enabled", []() {
    return TFRING_XLA_KERNELS != 0 && tfring::Config::FromEnvironment().xla;
  });
}
