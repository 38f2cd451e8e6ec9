// Unit tests of Adasum (ops/adasum.*): the pairwise formula, over threads
// that exchange bytes through mailboxes, against a double-precision
// reference. Built and run by tests/common/test_core_cpp.py (and by Bazel
// as //tf_ops:adasum_test).

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../ops/adasum.h"
#include "../reduction.h"

#include "check.h"

using namespace tfring;

// --- Adasum over threads that exchange bytes through mailboxes.

class Mailboxes {
 public:
  void Send(int from, int to, std::string bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    boxes_[{from, to}].push_back(std::move(bytes));
    cv_.notify_all();
  }
  std::string Receive(int from, int to) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& box = boxes_[{from, to}];
    cv_.wait(lock, [&] { return !box.empty(); });
    std::string out = std::move(box.front());
    box.pop_front();
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, std::deque<std::string>> boxes_;
};

class ThreadPointToPoint : public PointToPoint {
 public:
  ThreadPointToPoint(int rank, int size, Mailboxes* boxes) : rank_(rank), size_(size), boxes_(boxes) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                  int peer) override {
    boxes_->Send(rank_, peer, std::string(static_cast<const char*>(send), send_bytes));
    std::string got = boxes_->Receive(peer, rank_);
    if (static_cast<int64_t>(got.size()) != recv_bytes) return Status::Unknown("size mismatch");
    if (recv_bytes > 0) std::memcpy(recv, got.data(), recv_bytes);
    return Status::OK();
  }

 private:
  int rank_, size_;
  Mailboxes* boxes_;
};

// The pairwise formula, tensor by tensor, in double.
static std::vector<double> AdasumPair(const std::vector<double>& a, const std::vector<double>& b,
                                      const std::vector<int64_t>& counts) {
  std::vector<double> out(a.size());
  int64_t off = 0;
  for (int64_t c : counts) {
    double dot = 0, aa = 0, bb = 0;
    for (int64_t j = off; j < off + c; ++j) {
      dot += a[j] * b[j];
      aa += a[j] * a[j];
      bb += b[j] * b[j];
    }
    const double ca = aa > 0 ? 1 - dot / (2 * aa) : 1, cb = bb > 0 ? 1 - dot / (2 * bb) : 1;
    for (int64_t j = off; j < off + c; ++j) out[j] = ca * a[j] + cb * b[j];
    off += c;
  }
  return out;
}

// Runs AdasumAllreduce on `inputs.size()` threads; returns each rank's buffer.
template <typename T>
static std::vector<std::vector<T>> RunAdasum(const std::vector<std::vector<T>>& inputs,
                                             const std::vector<int64_t>& counts, DataType dtype,
                                             std::vector<Status>* statuses) {
  const int n = static_cast<int>(inputs.size());
  Mailboxes boxes;
  std::vector<std::vector<T>> bufs = inputs;
  statuses->assign(n, Status::OK());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ThreadPointToPoint p2p(r, n, &boxes);
      MappedBuffer scratch;
      (*statuses)[r] = AdasumAllreduce(&p2p, bufs[r].data(), counts, dtype, &scratch);
    });
  }
  for (auto& t : threads) t.join();
  return bufs;
}

static void TestAdasum() {
  const std::vector<int64_t> counts = {5, 0, 3, 17, 1, 64};
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::mt19937 gen(7);
  std::normal_distribution<double> normal;
  for (int n : {1, 2, 4, 8}) {
    std::vector<std::vector<double>> inputs(n, std::vector<double>(total));
    for (auto& v : inputs)
      for (auto& x : v) x = normal(gen);
    // The binary tree the algorithm computes: pairs at distance 1, then 2, ...
    std::vector<std::vector<double>> tree = inputs;
    for (int d = 1; d < n; d <<= 1)
      for (int r = 0; r < n; r += 2 * d) tree[r] = AdasumPair(tree[r], tree[r + d], counts);
    std::vector<Status> st;
    auto out = RunAdasum(inputs, counts, DataType::FLOAT64, &st);
    for (int r = 0; r < n; ++r) {
      CHECK(st[r].ok());
      CHECK(out[r] == out[0]);  // the same bits everywhere
      for (int64_t j = 0; j < total; ++j) CHECK(std::fabs(out[r][j] - tree[0][j]) < 1e-9);
    }
    std::vector<std::vector<float>> inputs32(n);
    for (int r = 0; r < n; ++r) inputs32[r].assign(inputs[r].begin(), inputs[r].end());
    auto out32 = RunAdasum(inputs32, counts, DataType::FLOAT32, &st);
    for (int r = 0; r < n; ++r) {
      CHECK(st[r].ok() && out32[r] == out32[0]);
      for (int64_t j = 0; j < total; ++j) CHECK(std::fabs(out32[r][j] - tree[0][j]) < 1e-4);
    }
    std::vector<std::vector<uint16_t>> inputs16(n, std::vector<uint16_t>(total));
    for (int r = 0; r < n; ++r)
      for (int64_t j = 0; j < total; ++j) inputs16[r][j] = FloatToHalf(static_cast<float>(inputs[r][j]));
    auto out16 = RunAdasum(inputs16, counts, DataType::FLOAT16, &st);
    for (int r = 0; r < n; ++r) {
      CHECK(st[r].ok() && out16[r] == out16[0]);
      for (int64_t j = 0; j < total; ++j)
        CHECK(std::fabs(HalfToFloat(out16[r][j]) - tree[0][j]) < 0.05 * (1 + std::fabs(tree[0][j])));
    }
  }
  {
    // Orthogonal vectors add up; equal ones are kept as they are (not doubled).
    std::vector<std::vector<double>> in = {{1, 0, 2, 2}, {0, 3, 2, 2}};
    std::vector<Status> st;
    auto out = RunAdasum(in, {2, 2}, DataType::FLOAT64, &st);
    CHECK((out[0] == std::vector<double>{1, 3, 2, 2}));
    // A zero vector leaves the other one as it is.
    in = {{0, 0}, {4, 5}};
    out = RunAdasum(in, {2}, DataType::FLOAT64, &st);
    CHECK((out[1] == std::vector<double>{4, 5}));
  }
  {
    std::vector<Status> st;
    std::vector<std::vector<double>> in(3, std::vector<double>(4, 1.0));
    RunAdasum(in, {4}, DataType::FLOAT64, &st);
    CHECK(!st[0].ok() && Contains(st[0].message(), "power-of-two number of ranks"));
    std::vector<std::vector<int32_t>> ints(2, std::vector<int32_t>(4, 1));
    RunAdasum(ints, {4}, DataType::INT32, &st);
    CHECK(!st[0].ok() && Contains(st[0].message(), "not int32"));
  }
}

int main() {
  TestAdasum();
  return CheckExitCode();
}
