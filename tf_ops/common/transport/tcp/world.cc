// The world's data path: posting sends and receives, moving bytes on each
// connection (within a budget per call), and matching arriving messages to
// posted receives in FIFO order per (context, tag), holding or buffering
// those that come early.
#include "world.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "../../logging.h"

namespace tfring {
namespace tcp {

TcpRequest::~TcpRequest() {
  if (!world) return;
  std::lock_guard<std::mutex> lock(world->mu());
  world->CancelLocked(this);
}

void World::CancelLocked(TcpRequest* req) {
  if (req->done) return;
  if (req->is_send) {
    SendOp* op = req->op;
    req->op = nullptr;
    if (op == nullptr) return;
    op->req = nullptr;
    Conn& c = conns_[size_t(req->peer)];
    if (op->written == 0) {
      for (auto it = c.sendq.begin(); it != c.sendq.end(); ++it) {
        if (it->get() == op) {
          c.sendq.erase(it);
          break;
        }
      }
    } else if (op->written < kPeerHeaderBytes + op->length) {
      uint64_t off = op->written > kPeerHeaderBytes ? op->written - kPeerHeaderBytes : 0;
      op->owned.assign(op->payload + off, op->length - off);
      op->base = off;
      if (op->owned.empty()) op->base = op->length;  // nothing left but the header
    }
    return;
  }
  Conn& c = conns_[size_t(req->peer)];
  if (req->posted) {
    auto it = c.posted.find(req->key);
    if (it != c.posted.end()) {
      auto& q = it->second;
      q.erase(std::remove(q.begin(), q.end(), req), q.end());
      if (q.empty()) c.posted.erase(it);
    }
    req->posted = false;
  }
  if (req->filling) {
    // The rest of the message is read and dropped: no byte lands in the
    // buffer of a cancelled receive.
    c.target = nullptr;
    req->filling = false;
  }
}

Status World::MismatchError(int peer, const Key& key, uint64_t sent, int64_t posted) const {
  return Status::PreconditionError(
      "tfring: " + Who(peer) + " sent a message of " + std::to_string(sent) +
      " bytes with tag " + std::to_string(key.second) + ", but the receive posted for it expects " +
      std::to_string(posted) + " bytes");
}

void World::DeliverLocal(const char* buf, int64_t bytes, Key key, TcpRequest* send) {
  Conn& c = conns_[size_t(rank_)];
  if (TcpRequest* r = c.TakePosted(key)) {
    r->posted = false;
    r->done = true;
    if (r->bytes != bytes) {
      r->error = MismatchError(rank_, key, uint64_t(bytes), r->bytes);
    } else if (bytes > 0) {
      std::memcpy(r->rbuf, buf, size_t(bytes));
    }
  } else {
    auto u = std::make_shared<Unexpected>();
    u->data.assign(buf, size_t(bytes));
    u->length = uint64_t(bytes);
    u->complete = true;
    c.unexpected[key].push_back(std::move(u));
  }
  send->done = true;
}

Status World::Isend(const void* buf, int64_t bytes, int peer, Key key,
                    std::shared_ptr<World> self, CommRequestPtr* out) {
  auto req = std::unique_ptr<TcpRequest>(new TcpRequest());
  req->world = std::move(self);
  req->is_send = true;
  req->peer = peer;
  req->key = key;
  req->bytes = bytes;
  // A request still held in *out is destroyed (cancelled) first: its
  // destructor takes the lock.
  out->reset();
  std::lock_guard<std::mutex> lock(mu_);
  if (!abort_.ok()) {
    // Test() reports it.
  } else if (peer == rank_) {
    DeliverLocal(static_cast<const char*>(buf), bytes, key, req.get());
  } else {
    Conn& c = conns_[size_t(peer)];
    if (!c.gone.ok()) {
      req->error = c.gone;
      req->done = true;
    } else {
      auto op = std::unique_ptr<SendOp>(new SendOp());
      PeerHeader h;
      h.kind = PeerFrameKind::DATA;
      h.tag = key.second;
      h.context = key.first;
      h.length = uint64_t(bytes);
      EncodePeerHeader(h, op->header);
      op->payload = static_cast<const char*>(buf);
      op->length = uint64_t(bytes);
      op->req = req.get();
      req->op = op.get();
      c.sendq.push_back(std::move(op));
      // Small messages leave at once: latency is the point of a 4 KB send.
      bool moved = false;
      Flush(peer, &moved);
    }
  }
  *out = std::move(req);
  return Status::OK();
}

Status World::Irecv(void* buf, int64_t bytes, int peer, Key key, std::shared_ptr<World> self,
                    CommRequestPtr* out) {
  auto req = std::unique_ptr<TcpRequest>(new TcpRequest());
  req->world = std::move(self);
  req->peer = peer;
  req->key = key;
  req->bytes = bytes;
  req->rbuf = static_cast<char*>(buf);
  out->reset();  // as in Isend: never destroy a request under the lock
  std::lock_guard<std::mutex> lock(mu_);
  Conn& c = conns_[size_t(peer)];
  auto it = c.unexpected.find(key);
  if (it != c.unexpected.end()) {
    std::shared_ptr<Unexpected> u = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) c.unexpected.erase(it);
    if (u->length != uint64_t(bytes)) {
      req->error = MismatchError(peer, key, u->length, bytes);
      req->done = true;
      if (c.stash == u) c.stash.reset();  // drop the rest of it
    } else {
      if (!u->data.empty()) std::memcpy(req->rbuf, u->data.data(), u->data.size());
      req->received = int64_t(u->data.size());
      if (u->complete) {
        req->done = true;
      } else {
        // Still arriving: the rest goes straight into this buffer.
        c.stash.reset();
        c.target = req.get();
        req->filling = true;
      }
    }
  } else if (c.held && Key(c.cur.context, c.cur.tag) == key) {
    // Its payload is still in the kernel: it is read straight into this buffer.
    c.held = false;
    if (c.cur.length != uint64_t(bytes)) {
      req->error = MismatchError(peer, key, c.cur.length, bytes);
      req->done = true;  // the payload is read and dropped
    } else {
      c.target = req.get();
      req->filling = true;
    }
  } else if (!c.gone.ok() && peer != rank_) {
    req->error = c.gone;
    req->done = true;
  } else {
    // This message may lie behind a held one, which must then be read first.
    if (c.held) ReleaseHold(peer);
    c.posted[key].push_back(req.get());
    req->posted = true;
  }
  *out = std::move(req);
  return Status::OK();
}

Status World::Test(TcpRequest* req, bool* done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!abort_.ok()) return abort_;
  if (req->done) {
    *done = true;
    return req->error;
  }
  bool moved = false;
  ProgressConn(req->peer, &moved);
  // Other connections move too now and then, so two ranks that each test
  // only their own send cannot wait on each other's full socket buffers.
  if ((++test_calls_ & 15) == 0) ProgressOthers(req->peer);
  if (!abort_.ok()) return abort_;
  *done = req->done;
  return req->done ? req->error : Status::OK();
}

void World::Block(TcpRequest* req, int timeout_ms) {
  // Per thread and reused: a wait must not allocate (several threads may
  // wait at once, each on its own request).
  thread_local std::vector<pollfd> fds;
  thread_local std::vector<int> who;
  fds.clear();
  who.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_.ok() || req->done) return;
    // Every connection, not only the request's: a peer blocked on a full
    // socket buffer towards this rank must be read for it to go on.
    for (int p = 0; p < size(); ++p) {
      const Conn& c = conns_[size_t(p)];
      if (c.fd < 0 || p == rank_) continue;
      // A held frame keeps its connection readable; only its end (the
      // peer closing) matters until its receive is posted or the hold ends.
      short events = c.held ? short(POLLRDHUP) : short(POLLIN);
      if (!c.sendq.empty()) events |= POLLOUT;
      fds.push_back({c.fd, events, 0});
      who.push_back(p);
    }
  }
  fds.push_back({progress_fd_, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  if (fds.back().revents & POLLIN) {
    uint64_t v;
    ssize_t ignored = ::read(progress_fd_, &v, sizeof(v));
    (void)ignored;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i + 1 < fds.size() && abort_.ok(); ++i) {
    if (fds[i].revents == 0) continue;
    bool moved = false;
    ProgressConn(who[i], &moved);
  }
}

void World::ProgressConn(int peer, bool* moved) {
  if (peer == rank_ || !abort_.ok()) return;
  Flush(peer, moved);
  Read(peer, moved);
}

void World::ProgressOthers(int skip) {
  thread_local std::vector<pollfd> fds;  // as in Block
  thread_local std::vector<int> who;
  fds.clear();
  who.clear();
  for (int p = 0; p < size(); ++p) {
    const Conn& c = conns_[size_t(p)];
    if (c.fd < 0 || p == skip) continue;
    fds.push_back({c.fd, short(POLLIN | (c.sendq.empty() ? 0 : POLLOUT)), 0});
    who.push_back(p);
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    bool moved = false;
    ProgressConn(who[i], &moved);
  }
}

void World::Flush(int peer, bool* moved) {
  Conn& c = conns_[size_t(peer)];
  size_t budget = kProgressBudget;
  while (c.fd >= 0 && !c.sendq.empty() && abort_.ok() && budget > 0) {
    struct iovec iov[64];
    int n = 0;
    for (auto it = c.sendq.begin(); it != c.sendq.end() && n < 63; ++it) {
      SendOp* op = it->get();
      if (op->written < kPeerHeaderBytes) {
        iov[n++] = {op->header + op->written, kPeerHeaderBytes - op->written};
      }
      uint64_t off = op->written > kPeerHeaderBytes ? op->written - kPeerHeaderBytes : 0;
      if (off < op->length) {
        iov[n++] = {const_cast<char*>(op->PayloadAt(off)), size_t(op->length - off)};
      }
    }
    struct msghdr msg;
    std::memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = size_t(n);
    ssize_t w = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) {
        Fail(peer, PeerFailure::RESET, "");
      } else {
        Fail(peer, PeerFailure::IO, std::string("send: ") + std::strerror(errno));
      }
      return;
    }
    *moved = true;
    c.last_send = Clock::now();
    uint64_t left = uint64_t(w);
    budget -= std::min<size_t>(budget, size_t(w));
    while (left > 0 || (!c.sendq.empty() &&
                        c.sendq.front()->written == kPeerHeaderBytes + c.sendq.front()->length)) {
      SendOp* op = c.sendq.front().get();
      uint64_t need = kPeerHeaderBytes + op->length - op->written;
      uint64_t take = std::min(need, left);
      op->written += take;
      left -= take;
      if (op->written < kPeerHeaderBytes + op->length) break;
      if (op->req != nullptr) {
        op->req->done = true;
        op->req->op = nullptr;
      }
      c.sendq.pop_front();
    }
  }
}

void World::Read(int peer, bool* moved) {
  Conn& c = conns_[size_t(peer)];
  size_t budget = kProgressBudget;
  while (c.fd >= 0 && abort_.ok() && budget > 0) {
    if (c.held) {
      if (Clock::now() - c.held_since < kMaxHold) return;
      ReleaseHold(peer);
    }
    // First what is already staged.
    if (c.spos < c.slen) {
      Consume(peer, c.staging.data() + c.spos, c.slen - c.spos);
      continue;
    }
    if (c.goodbye && c.eof) return;
    char* dst = c.staging.data();
    size_t want = c.staging.size();
    bool direct = false;
    if (c.in_header && c.large_frames) {
      want = kPeerHeaderBytes - c.hdr_have;
    } else if (!c.in_header && c.target != nullptr) {
      uint64_t remaining = c.cur.length - c.cur_have;
      if (remaining >= kDirectReceive) {
        dst = c.target->rbuf + c.cur_have;
        want = size_t(std::min<uint64_t>(remaining, budget));
        direct = true;
      }
    }
    ssize_t n = ::recv(c.fd, dst, want, MSG_DONTWAIT);
    if (n == 0) {
      c.eof = true;
      if (c.goodbye) {
        c.Close();
        return;
      }
      Fail(peer, PeerFailure::CLOSED, "");
      return;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      if (c.goodbye) {
        c.Close();
        return;
      }
      if (errno == ECONNRESET) {
        Fail(peer, PeerFailure::RESET, "");
      } else {
        Fail(peer, PeerFailure::IO, std::string("recv: ") + std::strerror(errno));
      }
      return;
    }
    *moved = true;
    c.last_recv = Clock::now();
    budget -= std::min<size_t>(budget, size_t(n));
    if (direct) {
      c.cur_have += uint64_t(n);
      c.target->received = int64_t(c.cur_have);
      if (c.cur_have == c.cur.length) FinishMessage(peer);
    } else {
      c.spos = 0;
      c.slen = size_t(n);
    }
  }
}

// Takes bytes from the staging buffer into the frame in progress.
void World::Consume(int peer, const char* data, size_t n) {
  Conn& c = conns_[size_t(peer)];
  size_t used = 0;
  if (c.goodbye) {
    // Nothing may follow GOODBYE; whatever does is dropped.
    c.spos = c.slen;
    return;
  }
  if (c.in_header) {
    size_t take = std::min(n, kPeerHeaderBytes - c.hdr_have);
    std::memcpy(c.hdr + c.hdr_have, data, take);
    c.hdr_have += take;
    used = take;
    c.spos += used;
    if (c.hdr_have == kPeerHeaderBytes) {
      WireStatus ws = ParsePeerHeader(c.hdr, &c.cur);
      if (!ws.ok()) {
        Fail(peer, PeerFailure::PROTOCOL, ws.message());
        return;
      }
      c.hdr_have = 0;
      StartMessage(peer);
    }
    return;
  }
  uint64_t remaining = c.cur.length - c.cur_have;
  size_t take = size_t(std::min<uint64_t>(remaining, n));
  if (c.target != nullptr) {
    std::memcpy(c.target->rbuf + c.cur_have, data, take);
    c.target->received = int64_t(c.cur_have + take);
  } else if (c.stash) {
    c.stash->data.append(data, take);
  }
  c.cur_have += take;
  c.spos += take;
  if (c.cur_have == c.cur.length) FinishMessage(peer);
}

void World::StartMessage(int peer) {
  Conn& c = conns_[size_t(peer)];
  switch (c.cur.kind) {
    case PeerFrameKind::HEARTBEAT:
      return;  // in_header stays true
    case PeerFrameKind::GOODBYE:
      PeerLeft(peer);
      return;
    case PeerFrameKind::ABORT:
      c.in_header = false;
      c.cur_have = 0;
      c.target = nullptr;
      c.notice = true;
      c.stash = std::make_shared<Unexpected>();  // read in full, matched by nobody
      c.stash->length = c.cur.length;
      if (c.cur.length == 0) FinishMessage(peer);
      return;
    case PeerFrameKind::DATA:
      break;
  }
  c.in_header = false;
  c.cur_have = 0;
  c.target = nullptr;
  c.stash.reset();
  c.large_frames = c.cur.length >= kDirectReceive;
  Key key(c.cur.context, c.cur.tag);
  if (TcpRequest* r = c.TakePosted(key)) {
    r->posted = false;
    if (uint64_t(r->bytes) != c.cur.length) {
      r->error = MismatchError(peer, key, c.cur.length, r->bytes);
      r->done = true;  // the payload is read and dropped
    } else {
      c.target = r;
      r->filling = true;
    }
  } else if (c.large_frames && c.posted.empty()) {
    // Nobody waits on this connection: wait for this message's receive.
    c.held = true;
    c.held_since = Clock::now();
    return;
  } else {
    ReleaseHold(peer);
  }
  if (c.cur.length == 0) FinishMessage(peer);
}

void World::ReleaseHold(int peer) {
  Conn& c = conns_[size_t(peer)];
  c.held = false;
  auto u = std::make_shared<Unexpected>();
  u->length = c.cur.length;
  // Reserve at most kUnexpectedReserve up front: a ring's pieces (up to
  // 1 MiB) then land without regrowing, while a claimed length larger than
  // that is appended only as its bytes really arrive.
  u->data.reserve(size_t(std::min<uint64_t>(c.cur.length, kUnexpectedReserve)));
  c.unexpected[Key(c.cur.context, c.cur.tag)].push_back(u);
  c.stash = std::move(u);
}

void World::FinishMessage(int peer) {
  Conn& c = conns_[size_t(peer)];
  if (c.notice) {
    AbortNotice a;
    WireStatus ws = ParseAbort(c.stash ? c.stash->data : std::string(), &a);
    c.notice = false;
    c.stash.reset();
    c.in_header = true;
    c.cur_have = 0;
    if (!ws.ok() || a.failed_rank >= uint32_t(size()) || a.cause > kLastPeerFailure) {
      Fail(peer, PeerFailure::PROTOCOL, "a malformed ABORT notice");
    } else {
      Fail(int(a.failed_rank), PeerFailure(a.cause), a.detail, peer);
    }
    return;
  }
  if (c.target != nullptr) {
    c.target->done = true;
    c.target->filling = false;
    c.target = nullptr;
  }
  if (c.stash) {
    c.stash->complete = true;
    c.stash.reset();
  }
  c.in_header = true;
  c.cur_have = 0;
}

bool World::HasPendingWith(int peer) const {
  const Conn& c = conns_[size_t(peer)];
  if (!c.posted.empty() || c.target != nullptr) return true;
  for (const auto& op : c.sendq) {
    if (op->req != nullptr) return true;
  }
  return false;
}

bool World::HasPending() const {
  for (int p = 0; p < size(); ++p) {
    if (p != rank_ && HasPendingWith(p)) return true;
  }
  return false;
}

}  // namespace tcp
}  // namespace tfring
