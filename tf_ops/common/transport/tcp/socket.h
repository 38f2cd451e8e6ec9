// Blocking socket helpers with deadlines, for the TCP transport. Every wait
// is bounded by a deadline (or explicitly unbounded), so nothing here can
// hang on a silent peer; SIGPIPE is never raised (MSG_NOSIGNAL).
#ifndef TFRING_TRANSPORT_TCP_SOCKET_H
#define TFRING_TRANSPORT_TCP_SOCKET_H

#include <chrono>
#include <string>

#include "wire.h"

namespace tfring {
namespace tcp {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
inline Deadline NoDeadline() { return Deadline::max(); }
inline Deadline After(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

// Owns a connected socket; closes it on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { Close(); }
  void Close();
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Connects to host:port (names resolved with getaddrinfo), TCP_NODELAY set.
WireStatus Connect(const std::string& host, int port, Deadline deadline, Socket* out);

WireStatus SendAll(const Socket& s, const std::string& data, Deadline deadline);

// Reads one frame through `parser`: the frame must start by `start_deadline`
// and, once started, complete within `frame_seconds` (a half-sent frame
// cannot hold a reader forever).
WireStatus ReadFrame(const Socket& s, FrameParser* parser, Deadline start_deadline,
                     double frame_seconds, Frame* out);

// Fills `n` bytes from the OS's random source (getrandom).
WireStatus RandomBytes(size_t n, std::string* out);

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_SOCKET_H
