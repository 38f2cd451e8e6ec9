// Forming the world: every pair of ranks connected once (rank i connects
// to the ranks below it and accepts those above), each connection
// authenticated and its rank checked; and the listening socket the ranks
// publish. Internal to the TCP transport (tcp_communicator.h's
// ConnectTcpWorld).
#ifndef TFRING_TRANSPORT_TCP_MESH_H
#define TFRING_TRANSPORT_TCP_MESH_H

#include <memory>
#include <vector>

#include "../../status.h"
#include "tcp_communicator.h"
#include "world.h"

namespace tfring {
namespace tcp {

// ConnectTcpWorld's arguments and errors; on success the world's heartbeat
// thread runs and `*world` holds it.
Status ConnectMesh(int rank, const std::vector<TcpPeer>& peers,
                   std::unique_ptr<TcpListener> listener, const TcpOptions& options,
                   std::shared_ptr<World>* world);

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_MESH_H
