// How a binding starts tfring, one entry point per transport. Each
// transport defines its own (mpi/mpi_init.cc, tcp/tcp_backend.cc), so the
// bindings (python_module.cc) need no transport's headers; a build without
// MPI (TFRING_WITH_MPI=0) gets the MPI entry from mpi_absent.cc instead.
#ifndef TFRING_COMMON_TRANSPORT_ENTRY_POINTS_H
#define TFRING_COMMON_TRANSPORT_ENTRY_POINTS_H

#include <cstdint>

#include "../status.h"

namespace tfring {

// Starts tfring over an MPI communicator given by its Fortran handle
// (mpi4py's comm.py2f()). Idempotent while running; after shutdown() it
// starts afresh; after MPI communication broke it refuses (MPI cannot
// recover). In a build without MPI: PRECONDITION_ERROR saying so.
Status InitializeMPI(int64_t fortran_comm);
// Whether this library was built with the MPI transport.
bool MPIBuilt();

// Starts tfring over TCP with the settings of the environment (Config).
Status InitializeTCP();

}  // namespace tfring

#endif  // TFRING_COMMON_TRANSPORT_ENTRY_POINTS_H
