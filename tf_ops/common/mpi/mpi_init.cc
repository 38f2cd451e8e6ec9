// The MPI transport's registration (transport/registry.h): its backend over
// the communicator a binding names.
#include "../transport/registry.h"

#include <mpi.h>

#include "mpi_backend.h"

namespace tfring {
namespace {

Status MakeMPIBackend(const Config&, const TransportArgs& args, std::unique_ptr<Backend>* out) {
  std::unique_ptr<MPIBackend> backend;
  TFRING_RETURN_IF_ERROR(
      MPIBackend::Create(MPI_Comm_f2c(static_cast<MPI_Fint>(args.fortran_comm)), &backend));
  *out = std::move(backend);
  return Status::OK();
}

const bool kRegistered = RegisterTransport("mpi", &MakeMPIBackend);

}  // namespace
}  // namespace tfring
