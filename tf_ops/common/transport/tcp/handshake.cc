#include "handshake.h"

#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "../../logging.h"
#include "sha256.h"

namespace tfring {
namespace tcp {

std::string PeerName(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return std::string(host) + ":" + serv;
}

void HandshakeServer::AcceptAll(int listen_fd) {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN, or a transient error: the next poll retries
    Socket s(fd);
    std::string who = PeerName(fd);
    if (pending_.size() >= kMaxPendingHandshakes) {
      Refuse(who, "too many connections are authenticating at once");
      continue;
    }
    Pending p;
    p.who = who;
    p.deadline = After(kHandshakeSeconds);
    std::string frame;
    WireStatus ws = RandomBytes(kNonceBytes, &p.nonce);
    if (ws.ok()) {
      frame = Writer(kChallenge).Raw(std::string(kMagic, 4)).U8(kVersion).Raw(p.nonce).Frame();
      ssize_t n = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
      if (n != ssize_t(frame.size())) {
        ws = WireStatus::Error(WireCause::IO_ERROR, "cannot send the challenge");
      }
    }
    if (!ws.ok()) {
      Refuse(who, ws.message());
      continue;
    }
    p.sock = std::move(s);
    pending_.push_back(std::move(p));
  }
}

void HandshakeServer::Progress(const Check& check, std::vector<std::pair<int, Socket>>* ready) {
  auto now = Clock::now();
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    int rank = -1;
    std::string why;
    bool finished = Step(&p, check, &rank, &why);
    if (!finished && now >= p.deadline) {
      finished = true;
      why = "the handshake did not complete within " + Seconds(kHandshakeSeconds) + " s";
    }
    if (finished) {
      if (rank >= 0) {
        ready->emplace_back(rank, std::move(p.sock));
      } else {
        Refuse(p.who, why);
      }
      pending_.erase(pending_.begin() + long(i));
    } else {
      ++i;
    }
  }
}

void HandshakeServer::DropAll(const std::string& why) {
  for (auto& p : pending_) Refuse(p.who, why);
  pending_.clear();
}

void HandshakeServer::Refuse(const std::string& who, const std::string& why) {
  TFRING_LOG(WARNING) << "tfring: rank " << rank_ << " refused a connection from " << who
                      << ": " << why;
}

bool HandshakeServer::Step(Pending* p, const Check& check, int* rank, std::string* why) {
  char buf[kMaxHandshakeFrame + 8];
  for (;;) {
    Frame f;
    bool have = false;
    WireStatus ws = p->parser.Next(&f, &have);
    if (!ws.ok()) {
      *why = ws.message();
      return true;
    }
    if (have) {
      if (!p->authenticated) {
        Auth a;
        ws = ParseAuth(f, &a);
        if (!ws.ok()) {
          *why = "not a tfring peer: " + ws.message();
          SendError(p, 3, "authentication failed");
          return true;
        }
        std::string expected = ClientMac(secret_, p->nonce, a.client_nonce, a.context);
        if (a.context != kPeerContext ||
            !ConstantTimeEqual(expected.data(), a.mac.data(), kMacBytes)) {
          *why = a.context != kPeerContext
                     ? "authentication for another service ('" + a.context + "')"
                     : "wrong proof: it does not hold this job's secret";
          SendError(p, 3, "authentication failed");
          return true;
        }
        std::string ok =
            Writer(kAuthOk).Raw(ServerMac(secret_, p->nonce, a.client_nonce, a.context)).Frame();
        if (::send(p->sock.fd(), ok.data(), ok.size(), MSG_NOSIGNAL) != ssize_t(ok.size())) {
          *why = "cannot send AUTH_OK";
          return true;
        }
        p->authenticated = true;
        continue;
      }
      Hello h;
      ws = ParseHello(f, &h);
      if (!ws.ok()) {
        *why = "bad HELLO: " + ws.message();
        SendError(p, 2, ws.message());
        return true;
      }
      std::string refusal = check(h);
      if (!refusal.empty()) {
        *why = "authenticated, but " + refusal;
        SendError(p, 4, refusal);
        return true;
      }
      std::string ok = EncodeHelloOk(uint32_t(rank_));
      if (::send(p->sock.fd(), ok.data(), ok.size(), MSG_NOSIGNAL) != ssize_t(ok.size())) {
        *why = "cannot send HELLO_OK";
        return true;
      }
      *rank = int(h.client_rank);
      return true;
    }
    // Never read past the frame in progress: after HELLO the stream
    // belongs to the data path.
    size_t want = std::min(sizeof(buf), p->parser.Wanted());
    ssize_t n = ::recv(p->sock.fd(), buf, want, 0);
    if (n == 0) {
      *why = "closed the connection during the handshake";
      return true;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      if (errno == EINTR) continue;
      *why = std::string("recv: ") + std::strerror(errno);
      return true;
    }
    p->parser.Feed(reinterpret_cast<const uint8_t*>(buf), size_t(n));
  }
}

void HandshakeServer::SendError(Pending* p, uint8_t code, const std::string& message) {
  std::string e = Writer(kError).U8(code).Bytes(message.substr(0, 200)).Frame();
  (void)::send(p->sock.fd(), e.data(), e.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace tcp
}  // namespace tfring
