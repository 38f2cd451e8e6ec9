// The world's liveness: the heartbeat thread (heartbeats, silence
// detection, late connections refused), and how a failure spreads: the
// first cause is kept, the other ranks get an ABORT notice, and the world
// shuts down in order (GOODBYE) when nothing failed.
#include "world.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "../../logging.h"

namespace tfring {
namespace tcp {

void World::PeerLeft(int peer) {
  Conn& c = conns_[size_t(peer)];
  c.goodbye = true;
  c.gone = Status::PeerFailed(peer, "tfring stopped: " + Who(peer) + " closed its connection");
  if (HasPendingWith(peer)) {
    // It left while this rank still needed it: the job cannot go on.
    Fail(peer, PeerFailure::LEFT, "");
    return;
  }
  TFRING_LOG(DEBUG) << "tfring: " << Who(peer) << " closed its connection in order";
  c.sendq.clear();  // only heartbeats can be queued here
  ::shutdown(c.fd, SHUT_WR);
}

void World::NotifyOthers(int failed, PeerFailure cause, const std::string& detail) {
  AbortNotice a;
  a.failed_rank = uint32_t(failed);
  a.cause = uint8_t(cause);
  a.detail = detail;
  std::string body = EncodeAbort(a);
  PeerHeader h;
  h.kind = PeerFrameKind::ABORT;
  h.length = body.size();
  uint8_t header[kPeerHeaderBytes];
  EncodePeerHeader(h, header);
  std::string frame = std::string(reinterpret_cast<char*>(header), sizeof(header)) + body;
  for (int p = 0; p < size(); ++p) {
    Conn& c = conns_[size_t(p)];
    if (p == rank_ || p == failed || c.fd < 0 || c.goodbye) continue;
    // A frame already begun cannot be interrupted; that peer finds out by
    // itself (its own detection, or this rank's connection closing).
    if (!c.sendq.empty() && c.sendq.front()->written > 0) continue;
    (void)::send(c.fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

void World::Fail(int peer, PeerFailure cause, const std::string& detail, int reporter) {
  if (!abort_.ok()) return;
  std::string what;
  switch (cause) {
    case PeerFailure::CLOSED: what = "closed its connection"; break;
    case PeerFailure::LEFT: what = "closed its connection in the middle of an exchange"; break;
    case PeerFailure::EXITED: what = "has exited or was killed"; break;
    case PeerFailure::RESET: what = "reset its connection"; break;
    case PeerFailure::SILENT: what = "sent nothing for " + detail; break;
    case PeerFailure::PROTOCOL: what = "sent a malformed frame: " + detail; break;
    case PeerFailure::IO: what = "connection failed: " + detail; break;
  }
  abort_ = Status::PeerFailed(
      peer, "tfring stopped: " + Who(peer) + " " + what +
                (reporter >= 0 ? " (reported by rank " + std::to_string(reporter) + ")" : ""));
  // The other ranks learn the first cause from here rather than later from
  // this rank going quiet, and fail now rather than after their own timeout.
  if (reporter < 0) NotifyOthers(peer, cause, detail);
  // Nothing more is read or written: no buffer is touched after the error.
  for (auto& c : conns_) c.target = nullptr;
  if (HasPending()) {
    TFRING_LOG(WARNING) << abort_.message();
  } else {
    TFRING_LOG(DEBUG) << abort_.message();
  }
}

void World::Start() {
  // Silence counts from now: the mesh set-up may have taken longer than
  // three heartbeats, with nobody reading the first connections meanwhile.
  for (auto& c : conns_) c.last_recv = c.last_send = Clock::now();
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  progress_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { ThreadMain(); });
}

void World::ThreadMain() {
  const double hb = std::max(0.01, options_.heartbeat_seconds);
  const int period_ms = int(std::max(5.0, std::min(250.0, hb * 1000.0 / 4)));
  const auto half = std::chrono::duration<double>(hb / 2);
  // Reused from wake-up to wake-up: a fresh vector was an allocation per
  // heartbeat period in a job that allocates nothing per collective.
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    if (listener_) fds.push_back({listener_->fd(), POLLIN, 0});
    handshakes_.AddPollFds(&fds);
    ::poll(fds.data(), fds.size(), period_ms);
    if (stop_.load()) return;
    // Late connections: after start-up every rank is connected, so an
    // authenticated one is refused too (and logged, like any other).
    if (listener_) handshakes_.AcceptAll(listener_->fd());
    std::vector<std::pair<int, Socket>> ready;
    handshakes_.Progress(
        [](const Hello& h) {
          return "rank " + std::to_string(h.client_rank) + " is already connected";
        },
        &ready);
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_.ok()) continue;
    // Drain first: a peer's bytes waiting in the kernel are not silence,
    // even if this process was not scheduled for a while.
    bool moved = false;
    for (int p = 0; p < size() && abort_.ok(); ++p) ProgressConn(p, &moved);
    if (moved) {
      uint64_t one = 1;
      ssize_t ignored = ::write(progress_fd_, &one, sizeof(one));
      (void)ignored;
    }
    auto now = Clock::now();
    for (int p = 0; p < size() && abort_.ok(); ++p) {
      Conn& c = conns_[size_t(p)];
      if (p == rank_ || c.fd < 0 || c.goodbye) continue;
      double silent = std::chrono::duration<double>(now - c.last_recv).count();
      if (silent > 3 * hb) {
        Fail(p, PeerFailure::SILENT,
             Seconds(silent) + " s (heartbeat interval " + Seconds(hb) + " s)");
        break;
      }
      if (c.sendq.empty() && now - c.last_send >= half) {
        auto op = std::unique_ptr<SendOp>(new SendOp());
        PeerHeader h;
        h.kind = PeerFrameKind::HEARTBEAT;
        EncodePeerHeader(h, op->header);
        c.sendq.push_back(std::move(op));
        bool moved = false;
        Flush(p, &moved);
      }
    }
  }
}

World::~World() {
  if (thread_.joinable()) {
    stop_.store(true);
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
    (void)ignored;
    thread_.join();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (progress_fd_ >= 0) ::close(progress_fd_);
  Shutdown();
}

// Says GOODBYE on every live connection, finishes any frame a cancelled
// send left half-written, and reads until the peer closes too (bounded), so
// closing never resets a connection with bytes still unread on either side.
// A failed world just closes: its peers have failed (or are told by ABORT).
void World::Shutdown() {
  if (abort_.ok()) {
    for (int p = 0; p < size(); ++p) {
      Conn& c = conns_[size_t(p)];
      if (c.fd < 0 || c.goodbye) continue;
      // Only frames already begun must finish; the others are dropped.
      while (!c.sendq.empty() && c.sendq.back()->written == 0) c.sendq.pop_back();
      auto op = std::unique_ptr<SendOp>(new SendOp());
      PeerHeader h;
      h.kind = PeerFrameKind::GOODBYE;
      EncodePeerHeader(h, op->header);
      c.sendq.push_back(std::move(op));
    }
  }
  Deadline deadline = After(std::min(2.0, std::max(0.5, 2 * options_.heartbeat_seconds)));
  while (abort_.ok()) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int p = 0; p < size(); ++p) {
      Conn& c = conns_[size_t(p)];
      if (c.fd < 0) continue;
      if (c.sendq.empty()) ::shutdown(c.fd, SHUT_WR);  // after GOODBYE: our FIN
      fds.push_back({c.fd, short(POLLIN | (c.sendq.empty() ? 0 : POLLOUT)), 0});
      who.push_back(p);
    }
    if (fds.empty()) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    if (::poll(fds.data(), fds.size(), int(left.count()) + 1) <= 0) continue;
    for (size_t i = 0; i < fds.size() && abort_.ok(); ++i) {
      Conn& c = conns_[size_t(who[i])];
      if (fds[i].revents & POLLOUT) {
        bool moved = false;
        Flush(who[i], &moved);
      }
      if (c.fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        // Whatever the peer still sends is for nobody now; read to its FIN.
        char buf[65536];
        ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) c.Close();
      }
    }
  }
  for (auto& c : conns_) c.Close();
}

}  // namespace tcp
}  // namespace tfring
