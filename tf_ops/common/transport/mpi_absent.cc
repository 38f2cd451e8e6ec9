// The MPI entry points of a build without the MPI transport
// (TFRING_WITH_MPI=0, which leaves out common/mpi/); every other build
// takes them from mpi/mpi_init.cc and compiles nothing here.
#include "entry_points.h"

#if defined(TFRING_WITH_MPI) && !TFRING_WITH_MPI

namespace tfring {

Status InitializeMPI(int64_t) {
  return Status::Misconfigured(
      "tfring: this library was built without MPI (TFRING_WITH_MPI=0), so it cannot start "
      "over an MPI communicator; use the TCP controller (tfringrun --tcp, "
      "TFRING_CONTROLLER=tcp) or rebuild with TFRING_WITH_MPI=1.");
}

bool MPIBuilt() { return false; }

}  // namespace tfring

#endif
