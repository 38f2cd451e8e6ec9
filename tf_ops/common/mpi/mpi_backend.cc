#include "mpi_backend.h"

#include <algorithm>

#include "../logging.h"
#include "../ops/data_plane_selector.h"
#include "../ops/mpi_data_plane.h"
#include "../ops/ring_data_plane.h"
#include "../ops/shm_data_plane.h"
#include "mpi_controller.h"

namespace tfring {

Status MPIBackend::Create(MPI_Comm base, std::unique_ptr<MPIBackend>* out) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    return Status::PreconditionError(
        "tfring: MPI is not initialised (or already finalised); import mpi4py's MPI before init()");
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  std::unique_ptr<MPIBackend> backend(new MPIBackend());
  backend->threads_supported_ = provided == MPI_THREAD_MULTIPLE;
  if (provided < MPI_THREAD_SERIALIZED) {
    return Status::PreconditionError(
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
  set->data_plane = MakeDataPlane(comm, hosts, config);
  return Status::OK();
}

std::unique_ptr<DataPlane> MPIBackend::MakeDataPlane(const std::shared_ptr<MPICommunicator>& comm,
                                                     const std::vector<std::string>& hosts,
                                                     const Config& config) {
  auto mpi = std::unique_ptr<DataPlane>(new MPIDataPlane(comm));
  std::unique_ptr<DataPlane> shm, cross_host;
  const std::string& ops = config.cpu_operations;
  const bool known = !hosts.empty() && comm->size() > 1;
  const bool one_host =
      known && std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) {
        return h == hosts[0];
      });
  // Every rank of the set sees the same hosts, so all make the same choices
  // and take part in the same collective set-up calls.
  if (one_host && (ops == "auto" || ops == "shm")) {
    Status s = CreateShmDataPlane(comm->rank(), comm->size(), mpi.get(), comm->monitor(), &shm);
    if (!s.ok()) {
      TFRING_LOG(WARNING) << "shared-memory data plane unavailable, using MPI: " << s.message();
      shm.reset();
    }
  }
  if (known && ((!one_host && ops == "auto") || ops == "ring")) {
    Status s = config.hierarchical_allreduce && !one_host
                   ? CreateHierarchicalDataPlane(comm, hosts, &cross_host)
                   : CreateRingDataPlane(comm, &cross_host);
    if (!s.ok()) {
      TFRING_LOG(WARNING) << "cross-host data plane unavailable, using MPI: " << s.message();
      cross_host.reset();
    }
  }
  DataPlaneChoice choice;
  choice.shm_min_bytes = config.shm_min_bytes;
  choice.cross_host_min_bytes = config.cross_host_min_bytes;
  return std::unique_ptr<DataPlane>(
      new DataPlaneSelector(std::move(mpi), std::move(shm), std::move(cross_host), choice));
}

}  // namespace tfring
