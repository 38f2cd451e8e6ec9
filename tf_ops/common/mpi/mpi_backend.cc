#include "mpi_backend.h"

#include <algorithm>

#include "../ops/data_plane_factory.h"
#include "../ops/mpi_data_plane.h"
#include "mpi_context.h"
#include "mpi_controller.h"

namespace tfring {

Status MPIBackend::Create(MPI_Comm base, std::unique_ptr<MPIBackend>* out) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    return Status::Misconfigured(
        "tfring: MPI is not initialised (or already finalised); import mpi4py's MPI before init()");
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  std::unique_ptr<MPIBackend> backend(new MPIBackend());
  backend->threads_supported_ = provided == MPI_THREAD_MULTIPLE;
  if (provided < MPI_THREAD_SERIALIZED) {
    return Status::Misconfigured(
        "tfring: MPI was initialised without thread support (MPI_THREAD_SERIALIZED or better is "
        "needed, because collectives run on a background thread)");
  }
  // A private copy keeps our traffic apart from the user's own MPI calls.
  MPI_Comm dup;
  TFRING_RETURN_IF_ERROR(MPIStatus(MPI_Comm_dup(base, &dup), "Comm_dup"));
  backend->global_ = std::make_shared<MPICommunicator>(dup);
  TFRING_RETURN_IF_ERROR(InitMPITypes());
  *out = std::move(backend);
  return Status::OK();
}

MPIBackend::~MPIBackend() {
  global_.reset();
  FreeMPITypes();
}

Status MPIBackend::CreateProcessSet(ProcessSet* set, const Config& config) {
  std::shared_ptr<MPICommunicator> comm;
  if (static_cast<int>(set->ranks.size()) == size()) {
    comm = global_;
  } else {
    const bool member =
        std::find(set->ranks.begin(), set->ranks.end(), rank()) != set->ranks.end();
    MPI_Comm split;
    TFRING_RETURN_IF_ERROR(MPIStatus(
        MPI_Comm_split(global_->get(), member ? 0 : MPI_UNDEFINED, rank(), &split), "Comm_split"));
    if (!member) return Status::OK();
    comm = std::make_shared<MPICommunicator>(split, global_->monitor());
  }
  set->rank = comm->rank();
  set->controller.reset(new MPIController(comm, set->ranks, config));
  std::vector<std::string> hosts;
  if (!hosts_.empty()) {
    for (int r : set->ranks) hosts.push_back(hosts_[r]);
  }
  // MPI's own collectives are the fallback: the shared-memory and ring planes
  // take over from their cut-over sizes.
  set->data_plane = MakeDataPlane(comm, std::unique_ptr<DataPlane>(new MPIDataPlane(comm)), hosts,
                                  config, rank());
  return Status::OK();
}

}  // namespace tfring
