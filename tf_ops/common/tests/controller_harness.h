// Controllers with a transport made of threads, shared by the C++ tests of
// negotiation (response_cache_test.cc) and of speculation (speculation_test.cc):
// several controllers in threads, joined by an in-memory exchange, so the
// response cache's protocol (bit allreduce + coordinator) runs for real.
#ifndef TFRING_COMMON_TESTS_CONTROLLER_HARNESS_H
#define TFRING_COMMON_TESTS_CONTROLLER_HARNESS_H

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../controller.h"
#include "../message.h"

namespace tfring {

inline const char* const kJoinName = "__tfring_join__";

inline Request Req(int rank, const std::string& name, CollectiveType type = CollectiveType::ALLREDUCE,
                   DataType dtype = DataType::FLOAT32, TensorShape shape = {4}) {
  Request r;
  r.request_rank = rank;
  r.name = name;
  r.type = type;
  r.dtype = dtype;
  r.shape = shape;
  return r;
}

// One all-gather of byte strings per call; every transport call maps to it.
class Exchange {
 public:
  explicit Exchange(int n) : n_(n), slots_(n) {}
  std::vector<std::string> AllGather(int rank, std::string mine) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return leaving_ == 0; });  // the last round is read
    slots_[rank] = std::move(mine);
    if (++arrived_ == n_) {
      result_ = slots_;
      arrived_ = 0;
      leaving_ = n_;
      ++round_;
      cv_.notify_all();
    } else {
      const uint64_t round = round_;
      cv_.wait(lock, [&] { return round_ != round; });
    }
    std::vector<std::string> out = result_;
    if (--leaving_ == 0) cv_.notify_all();
    return out;
  }

 private:
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> slots_, result_;
  int arrived_ = 0, leaving_ = 0;
  uint64_t round_ = 0;
};

class ThreadedController : public Controller {
 public:
  ThreadedController(int rank, int size, const Config& config, Exchange* ex)
      : Controller(rank, Ranks(size), config), ex_(ex) {}
  int negotiations = 0;  // cycles that went to the coordinator
  int bit_rounds = 0;    // cycles that ran the cache's bit allreduce
  // The data plane of a speculative response: only the divergence flag
  // travels (the tensors' values are the plane's business, tested apart).
  bool RunFlag(bool diverged) {
    bool agreed = true;
    for (const std::string& f : ex_->AllGather(rank(), diverged ? "1" : "0")) agreed &= f == "0";
    return agreed;
  }

 protected:
  Status GatherRequests(const std::string& mine, std::vector<std::string>* all) override {
    ++negotiations;
    *all = ex_->AllGather(rank(), mine);
    return Status::OK();
  }
  Status BroadcastResponses(std::string* bytes) override {
    *bytes = ex_->AllGather(rank(), *bytes)[0];
    return Status::OK();
  }
  Status AllreduceBitsAnd(std::vector<uint64_t>* words) override {
    ++bit_rounds;
    std::string mine(reinterpret_cast<const char*>(words->data()), words->size() * 8);
    for (const std::string& other : ex_->AllGather(rank(), mine)) {
      for (size_t i = 0; i < words->size(); ++i) {
        uint64_t w;
        std::memcpy(&w, other.data() + 8 * i, 8);
        (*words)[i] &= w;
      }
    }
    return Status::OK();
  }

 private:
  static std::vector<int> Ranks(int n) {
    std::vector<int> r;
    for (int i = 0; i < n; ++i) r.push_back(i);
    return r;
  }
  Exchange* ex_;
};

// A rank's script: steps run one after another, like eager collectives that
// each wait for their result. A step's batches are submitted in consecutive
// cycles (a kernel enqueuing a group's members while a cycle runs).
using Batches = std::vector<std::vector<Request>>;

}  // namespace tfring

#endif  // TFRING_COMMON_TESTS_CONTROLLER_HARNESS_H
