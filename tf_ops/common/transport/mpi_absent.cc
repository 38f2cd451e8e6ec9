// The MPI transport's place in a build without it (TFRING_WITH_MPI=0,
// which leaves out common/mpi/): registered as not built, with a maker that
// says so. Every other build registers it in mpi/mpi_init.cc and compiles
// nothing here.
#include "registry.h"

#if defined(TFRING_WITH_MPI) && !TFRING_WITH_MPI

namespace tfring {
namespace {

Status RefuseMPI(const Config&, const TransportArgs&, std::unique_ptr<Backend>*) {
  return Status::Misconfigured(
      "tfring: this library was built without MPI (TFRING_WITH_MPI=0), so it cannot start "
      "over an MPI communicator; use the TCP controller (tfringrun --tcp, "
      "TFRING_CONTROLLER=tcp) or rebuild with TFRING_WITH_MPI=1.");
}

const bool kRegistered = RegisterTransport("mpi", &RefuseMPI, /*built=*/false);

}  // namespace
}  // namespace tfring

#endif
