// MPI plumbing shared by the MPI controller and data plane: dtype and
// reduce-op mapping (float16/bfloat16 get user-defined ops). The
// communicator itself is in mpi_communicator.h.
#ifndef TFRING_COMMON_MPI_MPI_CONTEXT_H
#define TFRING_COMMON_MPI_MPI_CONTEXT_H

#include <mpi.h>

#include "../common.h"
#include "../status.h"
#include "mpi_communicator.h"

namespace tfring {

// The MPI datatype for `dtype` (a 2-byte opaque type for float16/bfloat16).
MPI_Datatype MPIDataType(DataType dtype);
// The MPI op for (`dtype`, `op`); float16/bfloat16 and bool map to our own.
Status MPIReduceOp(DataType dtype, ReduceOp op, MPI_Op* out);

// Creates the user-defined types and ops; call once after MPI is initialised.
Status InitMPITypes();
void FreeMPITypes();

}  // namespace tfring

#endif  // TFRING_COMMON_MPI_MPI_CONTEXT_H
