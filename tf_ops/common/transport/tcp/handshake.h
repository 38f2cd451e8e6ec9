// The listening side of the peer handshake (docs/wire.md: challenge, proof,
// HELLO), as a non-blocking state machine: many connections can be
// mid-handshake at once and none can stall the others. Used to form the
// mesh (mesh.cc) and, afterwards, by the heartbeat thread to refuse late
// comers (liveness.cc). Internal to the TCP transport.
#ifndef TFRING_TRANSPORT_TCP_HANDSHAKE_H
#define TFRING_TRANSPORT_TCP_HANDSHAKE_H

#include <poll.h>

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "peer_frame.h"
#include "socket.h"
#include "wire.h"

namespace tfring {
namespace tcp {

// A handshake (challenge, proof, HELLO) must finish within this, silence
// included, so a client that connects and says nothing costs one socket for
// a bounded time.
constexpr double kHandshakeSeconds = 10.0;
// Connections being authenticated at once; beyond this new ones are closed
// unread, so a flood cannot exhaust descriptors or memory.
constexpr size_t kMaxPendingHandshakes = 64;

// "1.5": seconds in messages.
inline std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

// "host:port" of the peer connected on `fd` (numeric), or "?".
std::string PeerName(int fd);

class HandshakeServer {
 public:
  // Returns "" to accept the authenticated peer's HELLO, else the reason to
  // refuse it.
  using Check = std::function<std::string(const Hello&)>;

  HandshakeServer(std::string secret, int rank) : secret_(std::move(secret)), rank_(rank) {}

  // Accepts every connection waiting on `listen_fd` and sends each its
  // challenge (or refuses it).
  void AcceptAll(int listen_fd);

  void AddPollFds(std::vector<pollfd>* fds) const {
    for (const auto& p : pending_) fds->push_back({p.sock.fd(), POLLIN, 0});
  }

  // Reads what has arrived on every pending connection; moves those whose
  // HELLO passed `check` into *ready as (rank, socket).
  void Progress(const Check& check, std::vector<std::pair<int, Socket>>* ready);

  size_t pending() const { return pending_.size(); }

  // Closes every connection still mid-handshake, each logged once.
  void DropAll(const std::string& why);

 private:
  struct Pending {
    Socket sock;
    std::string who, nonce;
    Deadline deadline;
    bool authenticated = false;
    FrameParser parser{kMaxHandshakeFrame};
  };

  void Refuse(const std::string& who, const std::string& why);
  // True when the connection is finished: *rank >= 0 accepted, else *why.
  bool Step(Pending* p, const Check& check, int* rank, std::string* why);
  void SendError(Pending* p, uint8_t code, const std::string& message);

  std::string secret_;
  int rank_;
  std::vector<Pending> pending_;
};

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_HANDSHAKE_H
