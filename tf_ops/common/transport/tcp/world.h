// The world of one ConnectTcpWorld: a connection per peer, the matching
// queues of posted receives and unexpected messages, and the heartbeat
// thread, shared by every communicator of the world and guarded by one
// mutex. world.cc moves bytes and matches messages; liveness.cc runs the
// heartbeat thread and spreads failures; mesh.cc connects it.
// Internal to the TCP transport.
#ifndef TFRING_TRANSPORT_TCP_WORLD_H
#define TFRING_TRANSPORT_TCP_WORLD_H

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../mapped_buffer.h"
#include "../../status.h"
#include "../communicator.h"
#include "handshake.h"
#include "peer_frame.h"
#include "socket.h"
#include "tcp_communicator.h"

namespace tfring {
namespace tcp {

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
  // Lives as long as the world: mapped, so a reset unmaps it (mapped_buffer.h).
  MappedBuffer staging;
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
    c.staging.Reserve(kStagingBytes);
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
  // What ended the world (a peer exited, went silent or broke the
  // protocol); OK while it works.
  Status Failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return abort_;
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

}  // namespace tcp
}  // namespace tfring

#endif  // TFRING_TRANSPORT_TCP_WORLD_H
