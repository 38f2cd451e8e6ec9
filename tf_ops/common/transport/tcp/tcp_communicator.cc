#include "tcp_communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "mesh.h"
#include "sha256.h"
#include "world.h"

namespace tfring {
namespace tcp {
namespace {

// Internal tags (negative: never a user's) of the Split exchange.
constexpr int32_t kSplitTag = -1;

uint64_t ContextId(const std::string& path) {
  Digest d = Sha256Of(path.data(), path.size());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | d[i];
  return v;
}

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
  Status TransportFailure() override { return world_->Failure(); }
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

}  // namespace

Status ConnectTcpWorld(int rank, const std::vector<TcpPeer>& peers,
                       std::unique_ptr<TcpListener> listener, const TcpOptions& options,
                       std::shared_ptr<Communicator>* world) {
  std::shared_ptr<World> w;
  TFRING_RETURN_IF_ERROR(ConnectMesh(rank, peers, std::move(listener), options, &w));
  const int size = int(peers.size());
  std::vector<int> everyone(static_cast<size_t>(size));
  for (int p = 0; p < size; ++p) everyone[size_t(p)] = p;
  *world = std::make_shared<TcpCommunicator>(std::move(w), "world", std::move(everyone), rank);
  return Status::OK();
}

}  // namespace tcp
}  // namespace tfring
