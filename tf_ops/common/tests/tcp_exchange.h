// What the TCP communicator's tests exchange on every rank of a world, shared
// by the in-process worlds (tcp_comm_test.cc, one thread per rank) and the
// multi-process jobs (ranks/tcp_comm_rank.cc, one process per rank): the
// same checks over threads and over processes.
#ifndef TFRING_COMMON_TESTS_TCP_EXCHANGE_H
#define TFRING_COMMON_TESTS_TCP_EXCHANGE_H

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../transport/communicator.h"
#include "check.h"

namespace tfring {
namespace test {

inline std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  uint32_t x = 2166136261u ^ uint32_t(seed * 7919 + int(n));
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = char(x >> 24);
  }
  return s;
}

inline Status SendRecv(Communicator& c, const std::string& out, int to, std::string* in,
                       int from, int tag) {
  std::vector<CommRequestPtr> reqs(2);
  TFRING_RETURN_IF_ERROR(c.Irecv(&(*in)[0], int64_t(in->size()), from, tag, &reqs[0]));
  TFRING_RETURN_IF_ERROR(c.Isend(out.data(), int64_t(out.size()), to, tag, &reqs[1]));
  return c.WaitAll(&reqs, "test exchange", true);
}

inline Status Send(Communicator& c, const std::string& out, int to, int tag) {
  CommRequestPtr r;
  TFRING_RETURN_IF_ERROR(c.Isend(out.data(), int64_t(out.size()), to, tag, &r));
  return c.Wait(r.get(), "test send", false);
}

inline Status Recv(Communicator& c, std::string* in, int from, int tag) {
  CommRequestPtr r;
  TFRING_RETURN_IF_ERROR(c.Irecv(&(*in)[0], int64_t(in->size()), from, tag, &r));
  return c.Wait(r.get(), "test receive", false);
}

inline void Sleep(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// ---------------------------------------------------------------------------
// Scenarios: each runs on every rank of a world.

inline void P2PSizes(Communicator& c) {
  const int n = c.size(), r = c.rank();
  const size_t sizes[] = {0, 1, 7, 4096, 65535, 65536, 1 << 20, (17u << 20) + 3};
  for (size_t sz : sizes) {
    std::string out = Pattern(sz, r), in(sz, 'x');
    Status s = SendRecv(c, out, (r + 1) % n, &in, (r + n - 1) % n, 11);
    CHECK(s.ok());
    CHECK(in == Pattern(sz, (r + n - 1) % n));
  }
}

inline void FifoAndUnexpected(Communicator& c) {
  if (c.size() < 2 || c.rank() > 1) return;
  const int kMsgs = 40;
  if (c.rank() == 0) {
    std::vector<std::string> bufs;
    for (int i = 0; i < kMsgs; ++i) bufs.push_back(Pattern(100 + 997 * i, i));
    std::vector<CommRequestPtr> reqs(kMsgs);
    for (int i = 0; i < kMsgs; ++i) {
      CHECK(c.Isend(bufs[i].data(), int64_t(bufs[i].size()), 1, 5, &reqs[i]).ok());
    }
    CHECK(c.WaitAll(&reqs, "fifo", false).ok());
    // Interleaved tags: A(1) B(2) C(1); a large unexpected one (tag 3)
    // arrives while nothing is posted for it.
    CHECK(Send(c, "A", 1, 1).ok());
    CHECK(Send(c, "B", 1, 2).ok());
    CHECK(Send(c, "C", 1, 1).ok());
    std::string big = Pattern(20u << 20, 3);
    CHECK(Send(c, big, 1, 3).ok());
    // A size mismatch: 100 bytes against a posted 50.
    CHECK(Send(c, std::string(100, 'm'), 1, 9).ok());
    CHECK(Send(c, "after", 1, 9).ok());
  } else {
    Sleep(0.3);  // everything above is unexpected by now (or arriving)
    for (int i = 0; i < kMsgs; ++i) {
      std::string in(100 + 997 * i, 'x');
      CHECK(Recv(c, &in, 0, 5).ok());
      CHECK(in == Pattern(100 + 997 * i, i));
    }
    std::string one(1, 'x');
    CHECK(Recv(c, &one, 0, 2).ok() && one == "B");
    CHECK(Recv(c, &one, 0, 1).ok() && one == "A");
    CHECK(Recv(c, &one, 0, 1).ok() && one == "C");
    std::string big(20u << 20, 'x');
    CHECK(Recv(c, &big, 0, 3).ok());
    CHECK(big == Pattern(20u << 20, 3));
    std::string half(50, 'x');
    Status s = Recv(c, &half, 0, 9);
    CHECK(!s.ok() && Contains(s.message(), "100 bytes") && Contains(s.message(), "50 bytes"));
    CHECK(Contains(s.message(), "rank 0") && Contains(s.message(), "tag 9"));
    std::string after(5, 'x');
    CHECK(Recv(c, &after, 0, 9).ok() && after == "after");
  }
}

// Large messages that arrive before their receive is posted wait in the
// kernel (world.h, kMaxHold). Every way out of that wait must
// deliver the right bytes in order: a receive for a message behind the held
// one (it is buffered so the later one can be reached), the hold outlasting
// its bound (when the heartbeat thread reads the header during the sleep),
// the matching receive, and a matching receive of the wrong size
// (an error; the stream goes on).
inline void HeldFrames(Communicator& c) {
  if (c.size() < 2 || c.rank() > 1) return;
  const size_t kBig = 1u << 20;
  if (c.rank() == 0) {
    std::vector<std::string> out = {Pattern(kBig, 31), "small", Pattern(kBig, 33),
                                    Pattern(kBig / 4, 34), Pattern(kBig / 2, 35), "end"};
    std::vector<CommRequestPtr> reqs(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      CHECK(c.Isend(out[i].data(), int64_t(out[i].size()), 1, int(31 + i), &reqs[i]).ok());
    }
    CHECK(c.WaitAll(&reqs, "held frames", false).ok());
    return;
  }
  Sleep(0.05);  // the first large message's header is in by the first Test
  std::string small(5, 'x');
  CHECK(Recv(c, &small, 0, 32).ok() && small == "small");
  std::string in(kBig, 'x');
  CHECK(Recv(c, &in, 0, 31).ok() && in == Pattern(kBig, 31));
  Sleep(0.3);  // longer than a hold lasts
  CHECK(Recv(c, &in, 0, 33).ok() && in == Pattern(kBig, 33));
  std::string quarter(kBig / 4, 'x');
  CHECK(Recv(c, &quarter, 0, 34).ok() && quarter == Pattern(kBig / 4, 34));
  std::string wrong(kBig / 2 + 8, 'x');
  Status s = Recv(c, &wrong, 0, 35);
  CHECK(!s.ok() && Contains(s.message(), std::to_string(kBig / 2) + " bytes"));
  std::string end(3, 'x');
  CHECK(Recv(c, &end, 0, 36).ok() && end == "end");
}

inline void CancelledReceive(Communicator& c) {
  if (c.size() < 2 || c.rank() > 1) return;
  if (c.rank() == 1) {
    std::string lost(4, 'x');
    CommRequestPtr r;
    CHECK(c.Irecv(&lost[0], 4, 0, 21, &r).ok());
    c.Cancel(&r);
    CHECK(r == nullptr);
    CHECK(Send(c, "go", 0, 22).ok());
    std::string in(4, 'x');
    CHECK(Recv(c, &in, 0, 21).ok() && in == "msg1");
    CHECK(lost == "xxxx");  // the cancelled receive took nothing
  } else {
    std::string go(2, 'x');
    CHECK(Recv(c, &go, 1, 22).ok());
    CHECK(Send(c, "msg1", 1, 21).ok());
  }
}

inline void SelfAndBadArgs(Communicator& c) {
  std::string in(3, 'x');
  CommRequestPtr rr, sr;
  CHECK(c.Isend("abc", 3, c.rank(), 4, &sr).ok());
  CHECK(c.Irecv(&in[0], 3, c.rank(), 4, &rr).ok());
  CHECK(c.Wait(sr.get(), "self", false).ok() && c.Wait(rr.get(), "self", false).ok());
  CHECK(in == "abc");
  CommRequestPtr bad;
  Status s = c.Isend("a", 1, c.size(), 0, &bad);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "rank"));
  s = c.Irecv(&in[0], 1, 0, -3, &bad);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT && Contains(s.message(), "tag"));
  CHECK(c.max_tag() >= 32767);
  CHECK(std::string(c.transport()) == "TCP");
}

inline void Collectives(Communicator& c) {
  const int n = c.size(), r = c.rank();
  std::vector<std::string> all;
  std::string mine = r == 1 ? std::string() : Pattern(10 + 1000 * r, r);
  CHECK(GatherBytes(c, mine, &all).ok());
  if (r == 0) {
    CHECK(int(all.size()) == n);
    for (int i = 0; i < n && int(all.size()) == n; ++i) {
      CHECK(all[i] == (i == 1 ? std::string() : Pattern(10 + 1000 * i, i)));
    }
  }
  std::string b = r == 0 ? Pattern(300000, 42) : std::string("stale");
  CHECK(BroadcastBytes(c, &b).ok());
  CHECK(b == Pattern(300000, 42));
  std::vector<uint64_t> words = {~uint64_t(0), ~(uint64_t(1) << r), uint64_t(0xff) << r};
  CHECK(AllreduceBitsAnd(c, &words).ok());
  uint64_t expect1 = ~uint64_t(0), expect2 = ~uint64_t(0);
  for (int i = 0; i < n; ++i) {
    expect1 &= ~(uint64_t(1) << i);
    expect2 &= uint64_t(0xff) << i;
  }
  CHECK(words[0] == ~uint64_t(0) && words[1] == expect1 && words[2] == expect2);
  bool all_ok = true;
  CHECK(AgreeAll(c, r != n - 1, &all_ok).ok());
  CHECK(!all_ok);
  CHECK(AgreeAll(c, true, &all_ok).ok());
  CHECK(all_ok);
  CHECK(BarrierP2P(c).ok());
}

inline void SplitAndDup(Communicator& c) {
  const int n = c.size(), r = c.rank();
  // Ranks 0 and 2 (and 4...) form one group in reverse order; odd ranks
  // another, except rank 1 of a 3-rank world, which opts out.
  int color = r % 2;
  if (n == 3 && r == 1) color = -1;
  std::shared_ptr<Communicator> sub;
  CHECK(c.Split(color, -r, &sub).ok());
  if (color < 0) {
    CHECK(sub == nullptr);
  } else if (sub) {
    int members = 0;
    for (int i = 0; i < n; ++i) members += (i % 2 == color && !(n == 3 && i == 1)) ? 1 : 0;
    CHECK(sub->size() == members);
    int higher = 0;  // key -rank: higher world ranks come first
    for (int i = r + 1; i < n; ++i) higher += (i % 2 == color) ? 1 : 0;
    CHECK(sub->rank() == higher);
    // The same tag on the sub-communicator and the world never cross.
    if (sub->size() > 1) {
      int m = sub->size(), me = sub->rank();
      std::string in(16, 'x');
      CHECK(SendRecv(*sub, Pattern(16, 100 + r), (me + 1) % m, &in, (me + m - 1) % m, 11).ok());
      Collectives(*sub);
    }
  }
  // Dup: rank 0 sends on the dup first, then the world; rank 1 receives the
  // world's first and must get the world's message.
  std::shared_ptr<Communicator> dup;
  CHECK(c.Dup(&dup).ok());
  CHECK(dup && dup->size() == n && dup->rank() == r);
  if (dup && r == 0) {
    CHECK(Send(*dup, "dup!", 1, 7).ok());
    CHECK(Send(c, "wld!", 1, 7).ok());
  } else if (dup && r == 1) {
    Sleep(0.1);
    std::string in(4, 'x');
    CHECK(Recv(c, &in, 0, 7).ok() && in == "wld!");
    CHECK(Recv(*dup, &in, 0, 7).ok() && in == "dup!");
  }
  if (dup) CHECK(BarrierP2P(*dup).ok());
  // Splits of splits agree on their contexts too.
  std::shared_ptr<Communicator> all1, all2;
  CHECK(c.Split(0, r, &all1).ok() && all1);
  if (all1) {
    CHECK(all1->Split(0, r, &all2).ok() && all2);
    if (all2) Collectives(*all2);
  }
}

inline void Exchange(Communicator& c) {
  P2PSizes(c);
  FifoAndUnexpected(c);
  HeldFrames(c);
  CancelledReceive(c);
  SelfAndBadArgs(c);
  Collectives(c);
  SplitAndDup(c);
  CHECK(BarrierP2P(c).ok());
}
}  // namespace test
}  // namespace tfring

#endif  // TFRING_COMMON_TESTS_TCP_EXCHANGE_H
