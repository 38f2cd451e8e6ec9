// Client of the rendezvous store (tfring/runner/rendezvous.py serves it;
// docs/wire.md specifies the protocol). One request at a time; every call is
// bounded by a timeout and fails with a typed WireStatus.
#ifndef TFRING_TRANSPORT_TCP_RENDEZVOUS_CLIENT_H
#define TFRING_TRANSPORT_TCP_RENDEZVOUS_CLIENT_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "socket.h"
#include "wire.h"

namespace tfring {
namespace tcp {

// The context string both sides put into the proofs of a rendezvous
// connection; rank-to-rank connections will use their own.
extern const char kRendezvousContext[];

// Runs the client side of the challenge-response on a connected socket:
// answers the server's challenge and checks the server's own proof.
WireStatus ClientHandshake(const Socket& s, const std::string& secret,
                           const std::string& context, Deadline deadline);

class RendezvousClient {
 public:
  // `timeout` bounds connecting, the handshake and each reply; blocking
  // requests add their own wait to it.
  WireStatus Connect(const std::string& host, int port, const std::string& secret,
                     double timeout);
  void Close() { sock_.Close(); }
  // The numeric address of this end of the connection: the interface that
  // routes to the store, which the other ranks can usually reach too.
  std::string LocalAddress() const;

  WireStatus Set(const std::string& scope, const std::string& key, const std::string& value,
                 bool exclusive = false);
  WireStatus Get(const std::string& scope, const std::string& key, double timeout,
                 std::string* value);
  WireStatus Add(const std::string& scope, const std::string& key, int64_t delta,
                 int64_t* result);
  WireStatus Wait(const std::string& scope, const std::vector<std::string>& keys,
                  double timeout);
  WireStatus WaitPrefix(const std::string& scope, const std::string& prefix, uint32_t count,
                        double timeout,
                        std::vector<std::pair<std::string, std::string>>* entries);
  WireStatus DeleteScope(const std::string& scope);
  WireStatus Ping();

 private:
  WireStatus Call(const std::string& frame, double wait, Frame* reply);

  Socket sock_;
  FrameParser parser_{kMaxFrame};
  double timeout_ = 30.0;
  std::string where_;  // "rendezvous HOST:PORT", for messages
};

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_RENDEZVOUS_CLIENT_H
