// The MPI transport's entry point into the generic start-up (operations.h:
// Initialize).
#include "../transport/entry_points.h"

#include <mpi.h>

#include "../operations.h"
#include "mpi_backend.h"

namespace tfring {

Status InitializeMPI(int64_t fortran_comm) {
  // Decided before the backend exists: creating it duplicates the
  // communicator, a collective that may hang when MPI broke earlier.
  bool running = false;
  TFRING_RETURN_IF_ERROR(CheckCanStart(&running));
  if (running) return Status::OK();
  std::unique_ptr<MPIBackend> backend;
  TFRING_RETURN_IF_ERROR(
      MPIBackend::Create(MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_comm)), &backend));
  return Initialize(std::move(backend), Config::FromEnvironment());
}

bool MPIBuilt() { return true; }

}  // namespace tfring
