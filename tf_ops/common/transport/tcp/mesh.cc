#include "mesh.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "../../logging.h"
#include "handshake.h"
#include "rendezvous_client.h"
#include "wire.h"

namespace tfring {
namespace tcp {
namespace {

constexpr int kDesiredSocketBuffer = 4 << 20;

bool SplitHostPort(const std::string& addr, std::string* host, int* port) {
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon + 1 >= addr.size()) return false;
  std::string h = addr.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  char* end = nullptr;
  long p = std::strtol(addr.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535 || h.empty()) return false;
  *host = h;
  *port = int(p);
  return true;
}

int ReadSysctl(const char* path) {
  std::ifstream f(path);
  long v = 0;
  if (f >> v) return int(std::min<long>(v, 1 << 30));
  return 0;
}

// Large buffers let a ring keep the link busy; but setting SO_RCVBUF turns
// Linux's autotuning off and is capped at net.core.rmem_max, so a small cap
// would make the buffer smaller than autotuning gives. Only raise it where
// the cap allows the size we want.
void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  static const int rmax = ReadSysctl("/proc/sys/net/core/rmem_max");
  static const int wmax = ReadSysctl("/proc/sys/net/core/wmem_max");
  int want = kDesiredSocketBuffer;
  if (wmax >= want) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
  if (rmax >= want) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof(want));
}

// Connects to a lower rank and proves who we are.
WireStatus ConnectPeer(int rank, int peer, const TcpPeer& to, int size, const std::string& secret,
                       Deadline deadline, Socket* out) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(to.addr, &host, &port)) {
    return WireStatus::Error(WireCause::INVALID_ARGUMENT,
                             "address '" + to.addr + "' is not host:port");
  }
  WireStatus ws;
  Socket s;
  // The peer's listener was bound before its address was published, so a
  // refusal means it is not up yet (e.g. restarting): retry until the
  // deadline.
  for (;;) {
    ws = Connect(host, port, deadline, &s);
    if (ws.ok() || ws.cause() != WireCause::PEER_CLOSED || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  TFRING_WIRE_RETURN_IF_ERROR(ws);
  TFRING_WIRE_RETURN_IF_ERROR(ClientHandshake(s, secret, kPeerContext, deadline));
  Hello h;
  h.client_rank = uint32_t(rank);
  h.server_rank = uint32_t(peer);
  h.size = uint32_t(size);
  TFRING_WIRE_RETURN_IF_ERROR(SendAll(s, EncodeHello(h), deadline));
  FrameParser parser(kMaxHandshakeFrame);
  Frame f;
  TFRING_WIRE_RETURN_IF_ERROR(ReadFrame(s, &parser, deadline, kHandshakeSeconds, &f));
  uint32_t got = 0;
  TFRING_WIRE_RETURN_IF_ERROR(ParseHelloOk(f, &got));
  if (got != uint32_t(peer)) {
    return WireStatus::Error(WireCause::PROTOCOL_ERROR,
                             "the listener at " + to.addr + " is rank " + std::to_string(got));
  }
  TuneSocket(s.fd());
  *out = std::move(s);
  return WireStatus::OK();
}

}  // namespace

std::string TcpListener::address() const {
  if (host_.find(':') != std::string::npos) return "[" + host_ + "]:" + std::to_string(port_);
  return host_ + ":" + std::to_string(port_);
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) ::close(fd_);
}

Status TcpListener::Open(const std::string& bind_host, int port,
                         std::unique_ptr<TcpListener>* out) {
  if (port < 0 || port > 65535) {
    return Status::InvalidArgument("tfring: listening port " + std::to_string(port) +
                                   " is not in [0, 65535]");
  }
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  const char* node = bind_host.empty() ? nullptr : bind_host.c_str();
  if (!node) hints.ai_family = AF_INET;
  int gai = getaddrinfo(node, std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) {
    return Status::InvalidArgument("tfring: cannot resolve the bind address '" + bind_host +
                                   "': " + gai_strerror(gai));
  }
  std::string error = "no address";
  for (struct addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      error = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      error = std::string("bind/listen: ") + std::strerror(errno);
      ::close(fd);
      continue;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), serv, sizeof(serv),
                NI_NUMERICHOST | NI_NUMERICSERV);
    freeaddrinfo(res);
    out->reset(new TcpListener(fd, host, std::atoi(serv)));
    return Status::OK();
  }
  freeaddrinfo(res);
  return Status::Aborted("tfring: cannot listen on '" + bind_host + "' port " +
                         std::to_string(port) + ": " + error);
}

Status ConnectMesh(int rank, const std::vector<TcpPeer>& peers,
                   std::unique_ptr<TcpListener> listener, const TcpOptions& options,
                   std::shared_ptr<World>* world) {
  const int size = int(peers.size());
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::InvalidArgument("tfring: rank " + std::to_string(rank) +
                                   " is not in a world of " + std::to_string(size) + " ranks");
  }
  if (!listener) return Status::InvalidArgument("tfring: ConnectTcpWorld needs a listener");
  if (options.secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument("tfring: the job secret (TFRING_SECRET) must hold at least " +
                                   std::to_string(kMinSecretBytes) + " bytes");
  }
  if (!(options.heartbeat_seconds > 0)) {
    return Status::InvalidArgument("tfring: the heartbeat interval must be positive, got " +
                                   Seconds(options.heartbeat_seconds));
  }
  const Deadline deadline = After(options.connect_timeout);
  const int listen_fd = listener->fd();
  auto w = std::make_shared<World>(rank, peers, options, std::move(listener));
  // Lower ranks first: each of them is serving (or about to) once it has
  // reached the ranks below it, so the mesh forms without a cycle.
  for (int p = 0; p < rank; ++p) {
    Socket s;
    WireStatus ws = ConnectPeer(rank, p, peers[size_t(p)], size, options.secret, deadline, &s);
    if (!ws.ok()) {
      return Status::PeerFailed(p, "tfring: rank " + std::to_string(rank) +
                             " could not connect to rank " + std::to_string(p) + " (host " +
                             peers[size_t(p)].host + ", " + peers[size_t(p)].addr +
                             "): " + ws.message() + " (" +
                             WireCauseName(ws.cause()) + ")");
    }
    w->Adopt(p, std::move(s));
  }
  // Then every higher rank comes to us; strangers are refused on the way.
  HandshakeServer server(options.secret, rank);
  std::vector<bool> have(size_t(size), false);
  int missing = size - rank - 1;
  while (missing > 0) {
    std::vector<pollfd> fds;
    fds.push_back({listen_fd, POLLIN, 0});
    server.AddPollFds(&fds);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      std::string who;
      for (int p = rank + 1; p < size; ++p) {
        if (!have[size_t(p)]) who += (who.empty() ? "" : ", ") + std::to_string(p);
      }
      return Status::Timeout("tfring: rank " + std::to_string(rank) + " timed out after " +
                             Seconds(options.connect_timeout) +
                             " s waiting for rank(s) " + who + " to connect");
    }
    ::poll(fds.data(), fds.size(), int(std::min<long long>(left.count() + 1, 200)));
    server.AcceptAll(listen_fd);
    std::vector<std::pair<int, Socket>> ready;
    server.Progress(
        [&](const Hello& h) -> std::string {
          if (h.size != uint32_t(size)) {
            return "it belongs to a world of " + std::to_string(h.size) + " ranks, not " +
                   std::to_string(size);
          }
          if (h.server_rank != uint32_t(rank)) {
            return "it wanted rank " + std::to_string(h.server_rank) + ", this is rank " +
                   std::to_string(rank);
          }
          if (h.client_rank <= uint32_t(rank) || h.client_rank >= uint32_t(size)) {
            return "rank " + std::to_string(h.client_rank) + " may not connect to rank " +
                   std::to_string(rank);
          }
          if (have[h.client_rank]) {
            return "rank " + std::to_string(h.client_rank) + " is already connected";
          }
          return "";
        },
        &ready);
    for (auto& r : ready) {
      if (have[size_t(r.first)]) {  // two claims of one rank in the same round
        TFRING_LOG(WARNING) << "tfring: rank " << rank << " refused a second connection of rank "
                            << r.first;
        continue;
      }
      have[size_t(r.first)] = true;
      TuneSocket(r.second.fd());
      w->Adopt(r.first, std::move(r.second));
      --missing;
    }
  }
  server.DropAll("the handshake was still going on when every rank had connected");
  // From here the world's thread serves the listener and refuses late comers.
  w->Start();
  *world = std::move(w);
  return Status::OK();
}

}  // namespace tcp
}  // namespace tfring
