// The one-call submission paths of _tfring_core (array_submit.cc).
#ifndef TFRING_CORE_API_ARRAY_SUBMIT_H
#define TFRING_CORE_API_ARRAY_SUBMIT_H

#include <pybind11/pybind11.h>

namespace tfring {

// Adds submit_array(), submit_device() and interned_names() to `m`.
void DefineArraySubmit(pybind11::module_& m);

}  // namespace tfring

#endif  // TFRING_CORE_API_ARRAY_SUBMIT_H
