// Starting tfring over MPI: the MPI transport's entry point into the generic
// start-up (operations.h: Initialize).
#ifndef TFRING_COMMON_MPI_MPI_INIT_H
#define TFRING_COMMON_MPI_MPI_INIT_H

#include <cstdint>

#include "../status.h"

namespace tfring {

// Starts tfring over an MPI communicator given by its Fortran handle
// (mpi4py's comm.py2f()). Idempotent while running; after shutdown() it
// starts afresh; after MPI communication broke it refuses (MPI cannot
// recover).
Status InitializeMPI(int64_t fortran_comm);

}  // namespace tfring

#endif  // TFRING_COMMON_MPI_MPI_INIT_H
