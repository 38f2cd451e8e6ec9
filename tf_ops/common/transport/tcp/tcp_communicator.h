// The TCP implementation of the Communicator seam (transport/communicator.h):
// one authenticated connection per pair of ranks, shared by the world and
// every Split/Dup of it (a context id in each frame keeps their traffic
// apart), and a heartbeat thread per world that notices a dead or silent
// peer even while nobody polls. docs/wire.md specifies the bytes.
//
// Behind this header: handshake.h (the listening side of the peer
// handshake), mesh.h (connecting the world), world.h (connections,
// matching and progress; liveness.cc: heartbeats and failure spreading).
#ifndef TFRING_TRANSPORT_TCP_TCP_COMMUNICATOR_H
#define TFRING_TRANSPORT_TCP_TCP_COMMUNICATOR_H

#include <memory>
#include <string>
#include <vector>

#include "../../status.h"
#include "../communicator.h"

namespace tfring {
namespace tcp {

struct TcpOptions {
  std::string secret;              // raw bytes (DecodeSecretHex of TFRING_SECRET)
  double heartbeat_seconds = 1.0;  // TFRING_HEARTBEAT_SECONDS; a peer silent 3x this is dead
  double connect_timeout = 60.0;   // whole mesh set-up
};

// A listening socket bound before the address is published, so peers that
// read the address can connect at once (the kernel queues them).
class TcpListener {
 public:
  // bind_host "" = all interfaces; port 0 = any free port.
  // Returns INVALID_ARGUMENT for an unusable host or port, ABORTED when the
  // socket cannot be bound (e.g. the port is taken).
  static Status Open(const std::string& bind_host, int port, std::unique_ptr<TcpListener>* out);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  // The bound address ("0.0.0.0" for all interfaces) and port.
  std::string host() const { return host_; }
  int port() const { return port_; }
  // "host:port", ready to publish.
  std::string address() const;
  int fd() const { return fd_; }

 private:
  TcpListener(int fd, std::string host, int port) : fd_(fd), host_(std::move(host)), port_(port) {}
  int fd_;
  std::string host_;
  int port_;
};

struct TcpPeer {
  std::string addr;  // "host:port" the rank listens on ("[v6]:port" for IPv6)
  std::string host;  // its host name, for messages
};

// Collective over all `peers.size()` ranks: connects the full mesh (each pair
// once; rank i connects to every rank below it and accepts the ranks above),
// every connection authenticated with the HMAC challenge of docs/wire.md
// (context "tfring-peer") and the peer's rank checked, starts the heartbeat
// thread and returns the world communicator. `listener` stays with the world:
// later connections to it are refused and logged. Fails with ABORTED naming
// the rank that could not be reached when the mesh is not complete within
// options.connect_timeout, INVALID_ARGUMENT for bad arguments.
//
//   std::unique_ptr<TcpListener> l;
//   TcpListener::Open("127.0.0.1", 0, &l);      // publish l->address()
//   std::shared_ptr<Communicator> world;
//   ConnectTcpWorld(rank, peers, std::move(l), options, &world);
Status ConnectTcpWorld(int rank, const std::vector<TcpPeer>& peers,
                       std::unique_ptr<TcpListener> listener, const TcpOptions& options,
                       std::shared_ptr<Communicator>* world);

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_TCP_COMMUNICATOR_H
