#include "ring_data_plane.h"
namespace tfring {
Status CreateRingDataPlane(std::shared_ptr<MPICommunicator>, std::unique_ptr<DataPlane>*) {
  return Status::Unknown("ring data plane not built");
}
Status CreateHierarchicalDataPlane(std::shared_ptr<MPICommunicator>, const std::vector<std::string>&,
                                   std::unique_ptr<DataPlane>*) {
  return Status::Unknown("hierarchical data plane not built");
}
}  // namespace tfring
