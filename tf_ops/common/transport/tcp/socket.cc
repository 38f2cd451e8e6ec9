#include "socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace tfring {
namespace tcp {
namespace {

WireStatus Io(const std::string& what, int err) {
  return WireStatus::Error(WireCause::IO_ERROR, what + ": " + std::strerror(err));
}

// Milliseconds poll() may wait before `deadline`; -1 for none; 0 if past.
int PollMillis(Deadline deadline) {
  if (deadline == NoDeadline()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return int(std::min<long long>(left.count() + 1, 1 << 30));
}

// Waits for `events` on fd; TIMEOUT once the deadline passes.
WireStatus WaitFor(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    struct pollfd p = {fd, events, 0};
    int ms = PollMillis(deadline);
    if (ms == 0 && Clock::now() >= deadline) {
      return WireStatus::Error(WireCause::TIMEOUT, std::string("timed out ") + what);
    }
    int r = poll(&p, 1, ms);
    if (r > 0) return WireStatus::OK();
    if (r < 0 && errno != EINTR) return Io(std::string("poll while ") + what, errno);
  }
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::Close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

WireStatus Connect(const std::string& host, int port, Deadline deadline, Socket* out) {
  if (port <= 0 || port > 65535) {
    return WireStatus::Error(WireCause::INVALID_ARGUMENT,
                             "port " + std::to_string(port) + " is not in [1, 65535]");
  }
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  int gai = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) {
    return WireStatus::Error(WireCause::INVALID_ARGUMENT,
                             "cannot resolve host '" + host + "': " + gai_strerror(gai));
  }
  WireStatus last = WireStatus::Error(WireCause::IO_ERROR, "no address for '" + host + "'");
  for (struct addrinfo* a = res; a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      last = Io("socket", errno);
      continue;
    }
    int flags = fcntl(s.fd(), F_GETFL, 0);
    fcntl(s.fd(), F_SETFL, flags | O_NONBLOCK);
    int r = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno != EINPROGRESS) {
      last = WireStatus::Error(errno == ECONNREFUSED ? WireCause::PEER_CLOSED : WireCause::IO_ERROR,
                               std::string("connect: ") + std::strerror(errno));
      continue;
    }
    if (r != 0) {
      last = WaitFor(s.fd(), POLLOUT, deadline, "connecting");
      if (!last.ok()) continue;
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = WireStatus::Error(err == ECONNREFUSED ? WireCause::PEER_CLOSED : WireCause::IO_ERROR,
                                 std::string("connect: ") + std::strerror(err));
        continue;
      }
    }
    int one = 1;
    setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *out = std::move(s);
    freeaddrinfo(res);
    return WireStatus::OK();
  }
  freeaddrinfo(res);
  return last;
}

WireStatus SendAll(const Socket& s, const std::string& data, Deadline deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(s.fd(), data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += size_t(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      TFRING_WIRE_RETURN_IF_ERROR(WaitFor(s.fd(), POLLOUT, deadline, "sending"));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return WireStatus::Error(
          WireCause::PEER_CLOSED,
          std::string("the peer closed the connection while we were sending: ") +
              std::strerror(errno));
    }
    return Io("send", errno);
  }
  return WireStatus::OK();
}

WireStatus ReadFrame(const Socket& s, FrameParser* parser, Deadline start_deadline,
                     double frame_seconds, Frame* out) {
  Deadline deadline = start_deadline;
  bool started = parser->mid_frame();
  if (started) deadline = std::min(start_deadline, After(frame_seconds));
  char buf[65536];
  for (;;) {
    bool have = false;
    TFRING_WIRE_RETURN_IF_ERROR(parser->Next(out, &have));
    if (have) return WireStatus::OK();
    TFRING_WIRE_RETURN_IF_ERROR(WaitFor(s.fd(), POLLIN, deadline,
                                        started ? "reading a frame" : "waiting for a reply"));
    // Never read past the frame in progress: the bytes after it belong to
    // the next frame and the next caller's deadline.
    size_t want = std::min(sizeof(buf), parser->Wanted());
    ssize_t n = ::recv(s.fd(), buf, want, 0);
    if (n == 0) {
      return WireStatus::Error(WireCause::PEER_CLOSED,
                               started ? "the peer closed the connection in the middle of a frame"
                                       : "the peer closed the connection");
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      if (errno == ECONNRESET) {
        return WireStatus::Error(WireCause::PEER_CLOSED, "the peer reset the connection");
      }
      return Io("recv", errno);
    }
    parser->Feed(reinterpret_cast<const uint8_t*>(buf), size_t(n));
    if (!started) {
      started = true;
      deadline = std::min(start_deadline, After(frame_seconds));
    }
  }
}

WireStatus RandomBytes(size_t n, std::string* out) {
  out->assign(n, '\0');
  size_t off = 0;
  while (off < n) {
    ssize_t r = getrandom(&(*out)[off], n - off, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Io("getrandom", errno);
    }
    off += size_t(r);
  }
  return WireStatus::OK();
}

}  // namespace tcp
}  // namespace tfring
