#include "tcp_communicator.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "../../logging.h"
#include "peer_frame.h"
#include "rendezvous_client.h"
#include "sha256.h"
#include "socket.h"
#include "wire.h"

namespace tfring {
namespace tcp {
namespace {

// A handshake (challenge, proof, HELLO) must finish within this, silence
// included, so a client that connects and says nothing costs one socket for
// a bounded time.
constexpr double kHandshakeSeconds = 10.0;
// Connections being authenticated at once; beyond this new ones are closed
// unread, so a flood cannot exhaust descriptors or memory.
constexpr size_t kMaxPendingHandshakes = 64;
// Internal tags (negative: never a user's) of the Split exchange.
constexpr int32_t kSplitTag = -1;
// Bytes a single progress call moves on one connection before it returns,
// so one long stream cannot hold the lock (and other callers) for long.
constexpr size_t kProgressBudget = 8u << 20;
// A payload remainder at least this large is received straight into the
// posted buffer; smaller pieces go through the staging buffer.
constexpr size_t kDirectReceive = 64u << 10;
constexpr size_t kStagingBytes = 256u << 10;
constexpr size_t kUnexpectedReserve = 4u << 20;
// A DATA frame at least kDirectReceive long that arrives before its receive
// is posted is left in the kernel's socket buffer (its payload unread) for at
// most this long, waiting for the receive: once posted, the payload goes
// straight into it instead of being copied twice through an unexpected-message
// buffer. A ring posts its receives a few pieces ahead, so its pieces often
// arrive early; the hold ends sooner (read into a buffer as before) when a
// receive for another message of that connection is posted (it may lie
// behind), and after this bound, so a peer blocked on a full socket buffer
// and its heartbeats are never kept waiting for long.
constexpr auto kMaxHold = std::chrono::milliseconds(100);
constexpr int kDesiredSocketBuffer = 4 << 20;

using Key = std::pair<uint64_t, int32_t>;  // (context, tag)
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<uint64_t>()(k.first * 0x9E3779B97F4A7C15ull ^ uint32_t(k.second));
  }
};

// Why a peer counts as failed: typed, so nothing downstream parses text.
// Its values travel in ABORT notices (docs/wire.md): append only.
enum class PeerFailure : uint8_t {
  CLOSED = 0,
  RESET = 1,
  SILENT = 2,
  PROTOCOL = 3,
  IO = 4,
  LEFT = 5,
  EXITED = 6,  // the peer monitor found its process gone
};
constexpr uint8_t kLastPeerFailure = 6;

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

uint64_t ContextId(const std::string& path) {
  Digest d = Sha256Of(path.data(), path.size());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | d[i];
  return v;
}

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

// ---------------------------------------------------------------------------
// The listening side of the handshake, as a non-blocking state machine: many
// connections can be mid-handshake at once and none can stall the others.

class HandshakeServer {
 public:
  // Returns "" to accept the authenticated peer's HELLO, else the reason to
  // refuse it.
  using Check = std::function<std::string(const Hello&)>;

  HandshakeServer(std::string secret, int rank) : secret_(std::move(secret)), rank_(rank) {}

  void AcceptAll(int listen_fd) {
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

  void AddPollFds(std::vector<pollfd>* fds) const {
    for (const auto& p : pending_) fds->push_back({p.sock.fd(), POLLIN, 0});
  }

  // Reads what has arrived on every pending connection; moves those whose
  // HELLO passed `check` into *ready as (rank, socket).
  void Progress(const Check& check, std::vector<std::pair<int, Socket>>* ready) {
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

  size_t pending() const { return pending_.size(); }

  // Closes every connection still mid-handshake, each logged once.
  void DropAll(const std::string& why) {
    for (auto& p : pending_) Refuse(p.who, why);
    pending_.clear();
  }

 private:
  struct Pending {
    Socket sock;
    std::string who, nonce;
    Deadline deadline;
    bool authenticated = false;
    FrameParser parser{kMaxHandshakeFrame};
  };

  void Refuse(const std::string& who, const std::string& why) {
    TFRING_LOG(WARNING) << "tfring: rank " << rank_ << " refused a connection from " << who
                        << ": " << why;
  }

  // True when the connection is finished: *rank >= 0 accepted, else *why.
  bool Step(Pending* p, const Check& check, int* rank, std::string* why) {
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

  void SendError(Pending* p, uint8_t code, const std::string& message) {
    std::string e = Writer(kError).U8(code).Bytes(message.substr(0, 200)).Frame();
    (void)::send(p->sock.fd(), e.data(), e.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  std::string secret_;
  int rank_;
  std::vector<Pending> pending_;
};

// ---------------------------------------------------------------------------
// The world: connections, matching queues and the heartbeat thread, shared by
// every communicator of one ConnectTcpWorld and guarded by one mutex.

class World;

struct SendOp;

class TcpRequest : public CommRequest {
 public:
  ~TcpRequest() override;

  std::shared_ptr<World> world;
  bool is_send = false;
  int peer = -1;  // world rank
  Key key{0, 0};
  int64_t bytes = 0;
  // Receives: where the payload goes and how much has landed.
  char* rbuf = nullptr;
  int64_t received = 0;
  bool posted = false;   // waiting in its connection's posted queue
  bool filling = false;  // the connection's current incoming message
  // Sends: the queued frame (null once written or failed).
  SendOp* op = nullptr;
  bool done = false;
  Status error;  // a failure of this request alone (size mismatch, peer left)
};

struct SendOp {
  uint8_t header[kPeerHeaderBytes];
  const char* payload = nullptr;
  uint64_t length = 0;
  uint64_t written = 0;  // of header + payload
  // When the request is cancelled mid-frame, the rest of its payload is
  // copied here so the stream stays whole: owned holds payload[base:].
  std::string owned;
  uint64_t base = 0;
  TcpRequest* req = nullptr;

  const char* PayloadAt(uint64_t off) const {
    return owned.empty() && base == 0 ? payload + off : owned.data() + (off - base);
  }
};

struct Unexpected {
  std::string data;
  uint64_t length = 0;
  bool complete = false;
};

struct Conn {
  Socket sock;  // owns the descriptor
  int fd = -1;  // sock.fd() while open, -1 once closed
  void Close() {
    sock.Close();
    fd = -1;
  }
  std::deque<std::unique_ptr<SendOp>> sendq;
  // Incoming frame in progress.
  bool in_header = true;
  uint8_t hdr[kPeerHeaderBytes];
  size_t hdr_have = 0;
  PeerHeader cur;
  uint64_t cur_have = 0;
  TcpRequest* target = nullptr;         // a posted receive being filled
  std::shared_ptr<Unexpected> stash;    // or an unexpected message being buffered
  // Or neither yet: the payload waits in the kernel for its receive (see
  // kMaxHold); what of it is already staged stays in `staging`.
  bool held = false;
  Clock::time_point held_since;
  // The last DATA frame was large: read the next header alone, so that a
  // large payload behind it is received straight into its buffer rather
  // than partly through the staging buffer.
  bool large_frames = false;
  bool notice = false;                  // the frame in progress is an ABORT notice
  std::vector<char> staging;
  size_t spos = 0, slen = 0;
  std::unordered_map<Key, std::deque<TcpRequest*>, KeyHash> posted;
  std::unordered_map<Key, std::deque<std::shared_ptr<Unexpected>>, KeyHash> unexpected;
  // The oldest receive posted for `key` (messages match in FIFO order),
  // taken off the list; null when none is posted.
  TcpRequest* TakePosted(const Key& key) {
    auto it = posted.find(key);
    if (it == posted.end()) return nullptr;
    TcpRequest* r = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) posted.erase(it);
    return r;
  }
  Clock::time_point last_recv, last_send;
  bool goodbye = false;   // the peer closed in order: nothing more arrives
  bool eof = false;
  Status gone;            // set with goodbye: what later requests to it get
};

class World {
 public:
  World(int rank, std::vector<TcpPeer> peers, TcpOptions options,
        std::unique_ptr<TcpListener> listener)
      : rank_(rank),
        peers_(std::move(peers)),
        options_(std::move(options)),
        listener_(std::move(listener)),
        handshakes_(options_.secret, rank),
        conns_(peers_.size()) {}
  ~World();

  int rank() const { return rank_; }
  int size() const { return int(peers_.size()); }

  void Adopt(int peer, Socket sock) {
    Conn& c = conns_[size_t(peer)];
    c.sock = std::move(sock);
    c.fd = c.sock.fd();
    c.staging.resize(kStagingBytes);
    c.last_recv = c.last_send = Clock::now();
  }
  int listener_fd() const { return listener_->fd(); }
  void Start();

  Status Isend(const void* buf, int64_t bytes, int peer, Key key, std::shared_ptr<World> self,
               CommRequestPtr* out);
  Status Irecv(void* buf, int64_t bytes, int peer, Key key, std::shared_ptr<World> self,
               CommRequestPtr* out);
  Status Test(TcpRequest* req, bool* done);
  // Sleeps in poll() until a connection can move (or the heartbeat thread
  // has moved bytes, or `timeout_ms`), then moves what it can.
  void Block(TcpRequest* req, int timeout_ms);
  void CancelLocked(TcpRequest* req);
  // The peer monitor found `peer`'s process gone: fails the world with that
  // cause and tells the others, unless the world has failed already.
  void PeerExited(int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    if (peer >= 0 && peer < size() && peer != rank_) Fail(peer, PeerFailure::EXITED, "");
  }
  std::mutex& mu() { return mu_; }

 private:
  void ThreadMain();
  void ProgressConn(int peer, bool* moved);
  void ProgressOthers(int skip);
  void Flush(int peer, bool* moved);
  void Read(int peer, bool* moved);
  void Consume(int peer, const char* data, size_t n);
  void StartMessage(int peer);
  void FinishMessage(int peer);
  // Ends the hold of the frame in progress: its payload is read into an
  // unexpected-message buffer, as for any message nobody waits for yet.
  void ReleaseHold(int peer);
  void PeerLeft(int peer);
  // Fails the world: `peer` failed for `cause`, as seen by this rank or,
  // with reporter >= 0, by rank `reporter`, which sent an ABORT notice.
  void Fail(int peer, PeerFailure cause, const std::string& detail, int reporter = -1);
  void NotifyOthers(int failed, PeerFailure cause, const std::string& detail);
  bool HasPendingWith(int peer) const;
  bool HasPending() const;
  Status MismatchError(int peer, const Key& key, uint64_t sent, int64_t posted) const;
  std::string Who(int peer) const {
    return "rank " + std::to_string(peer) + " (host " + peers_[size_t(peer)].host + ")";
  }
  void DeliverLocal(const char* buf, int64_t bytes, Key key, TcpRequest* req);
  void Shutdown();

  const int rank_;
  const std::vector<TcpPeer> peers_;
  const TcpOptions options_;
  std::unique_ptr<TcpListener> listener_;
  HandshakeServer handshakes_;  // only the heartbeat thread touches it after start-up

  std::mutex mu_;
  std::vector<Conn> conns_;
  Status abort_;
  int test_calls_ = 0;

  std::thread thread_;
  int wake_fd_ = -1;
  // Written by the heartbeat thread when it has moved bytes, so that a waiter
  // asleep in Block() looks again: those bytes may have finished its request.
  int progress_fd_ = -1;
  std::atomic<bool> stop_{false};
};

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
  std::vector<pollfd> fds;
  std::vector<int> who;
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
  std::vector<pollfd> fds;
  std::vector<int> who;
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

void World::PeerLeft(int peer) {
  Conn& c = conns_[size_t(peer)];
  c.goodbye = true;
  c.gone = Status::Aborted("tfring stopped: " + Who(peer) + " closed its connection");
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
  abort_ = Status::Aborted("tfring stopped: " + Who(peer) + " " + what +
                           (reporter >= 0 ? " (reported by rank " + std::to_string(reporter) + ")"
                                          : ""));
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
  for (;;) {
    std::vector<pollfd> fds;
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

// ---------------------------------------------------------------------------

class TcpCommunicator : public Communicator {
 public:
  TcpCommunicator(std::shared_ptr<World> world, std::string path, std::vector<int> members,
                  int rank)
      : world_(std::move(world)),
        path_(std::move(path)),
        context_(ContextId(path_)),
        members_(std::move(members)),
        rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  const char* transport() const override { return "TCP"; }
  int max_tag() const override { return 0x7fffffff; }

  Status Isend(const void* buf, int64_t bytes, int peer, int tag, CommRequestPtr* out) override {
    TFRING_RETURN_IF_ERROR(CheckArgs("Isend", buf, bytes, peer, tag));
    return world_->Isend(buf, bytes, members_[size_t(peer)], Key(context_, tag), world_, out);
  }
  Status Irecv(void* buf, int64_t bytes, int peer, int tag, CommRequestPtr* out) override {
    TFRING_RETURN_IF_ERROR(CheckArgs("Irecv", buf, bytes, peer, tag));
    return world_->Irecv(buf, bytes, members_[size_t(peer)], Key(context_, tag), world_, out);
  }
  Status Test(CommRequest* req, bool* done) override {
    *done = true;
    if (req == nullptr) return Status::OK();
    auto* r = dynamic_cast<TcpRequest*>(req);
    if (r == nullptr) {
      return Status::InvalidArgument("tfring: Test() of a request of another transport");
    }
    *done = false;
    return r->world->Test(r, done);
  }
  void Cancel(CommRequestPtr* req) override { req->reset(); }
  void PeerProcessExited(int rank) override {
    if (rank >= 0 && rank < size()) world_->PeerExited(members_[size_t(rank)]);
  }
  bool Block(CommRequest* req, int timeout_ms) override {
    auto* r = dynamic_cast<TcpRequest*>(req);
    if (r == nullptr) return false;
    r->world->Block(r, timeout_ms);
    return true;
  }

  Status Split(int color, int key, std::shared_ptr<Communicator>* out) override {
    const uint64_t seq = next_child_++;
    const int n = size();
    int32_t mine[2] = {color, key};
    std::vector<int32_t> all(size_t(2 * n));
    all[size_t(2 * rank_)] = color;
    all[size_t(2 * rank_ + 1)] = key;
    // Control traffic: the parent's context with an internal (negative) tag,
    // so it never matches a user's message.
    std::vector<CommRequestPtr> reqs;
    for (int r = 0; r < n; ++r) {
      if (r == rank_) continue;
      CommRequestPtr s, q;
      TFRING_RETURN_IF_ERROR(world_->Irecv(&all[size_t(2 * r)], 8, members_[size_t(r)],
                                           Key(context_, kSplitTag), world_, &q));
      TFRING_RETURN_IF_ERROR(world_->Isend(mine, 8, members_[size_t(r)],
                                           Key(context_, kSplitTag), world_, &s));
      reqs.push_back(std::move(q));
      reqs.push_back(std::move(s));
    }
    TFRING_RETURN_IF_ERROR(WaitAll(&reqs, "split of a communicator", false));
    out->reset();
    if (color < 0) return Status::OK();
    std::vector<std::pair<std::pair<int32_t, int>, int>> chosen;  // ((key, rank), rank)
    for (int r = 0; r < n; ++r) {
      if (all[size_t(2 * r)] == color) chosen.push_back({{all[size_t(2 * r + 1)], r}, r});
    }
    std::sort(chosen.begin(), chosen.end());
    std::vector<int> members;
    int my = -1;
    for (const auto& c : chosen) {
      if (c.second == rank_) my = int(members.size());
      members.push_back(members_[size_t(c.second)]);
    }
    auto child = std::make_shared<TcpCommunicator>(
        world_, path_ + "/" + std::to_string(seq) + "s" + std::to_string(color), members, my);
    child->set_monitor(monitor());
    *out = std::move(child);
    return Status::OK();
  }

  Status Dup(std::shared_ptr<Communicator>* out) override {
    // Every member calls Dup in the same order, so the same sequence number
    // (and context id) comes out everywhere without a message.
    const uint64_t seq = next_child_++;
    auto child = std::make_shared<TcpCommunicator>(
        world_, path_ + "/" + std::to_string(seq) + "d", members_, rank_);
    child->set_monitor(monitor());
    *out = std::move(child);
    return Status::OK();
  }

 private:
  Status CheckArgs(const char* what, const void* buf, int64_t bytes, int peer, int tag) const {
    if (peer < 0 || peer >= size()) {
      return Status::InvalidArgument(std::string("tfring: ") + what + " to rank " +
                                     std::to_string(peer) + " of a communicator of size " +
                                     std::to_string(size()));
    }
    if (tag < 0) {
      return Status::InvalidArgument(std::string("tfring: ") + what + " with negative tag " +
                                     std::to_string(tag));
    }
    if (bytes < 0 || uint64_t(bytes) > kMaxPeerMessage) {
      return Status::InvalidArgument(std::string("tfring: ") + what + " of " +
                                     std::to_string(bytes) + " bytes");
    }
    if (buf == nullptr && bytes > 0) {
      return Status::InvalidArgument(std::string("tfring: ") + what + " with a null buffer");
    }
    return Status::OK();
  }

  std::shared_ptr<World> world_;
  std::string path_;
  uint64_t context_;
  std::vector<int> members_;  // communicator rank -> world rank
  int rank_;
  uint64_t next_child_ = 0;
};

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

Status ConnectTcpWorld(int rank, const std::vector<TcpPeer>& peers,
                       std::unique_ptr<TcpListener> listener, const TcpOptions& options,
                       std::shared_ptr<Communicator>* world) {
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
      return Status::Aborted("tfring: rank " + std::to_string(rank) +
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
      return Status::Aborted("tfring: rank " + std::to_string(rank) + " timed out after " +
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
  std::vector<int> everyone(static_cast<size_t>(size));
  for (int p = 0; p < size; ++p) everyone[size_t(p)] = p;
  *world = std::make_shared<TcpCommunicator>(std::move(w), "world", std::move(everyone), rank);
  return Status::OK();
}

}  // namespace tcp
}  // namespace tfring
