// In-process TCP worlds, one thread per rank over real loopback sockets, for
// the tests of what runs on a communicator (tcp_comm_test.cc,
// allreduce_algorithms_test.cc). There is no global state, so several
// worlds, one after another, live in one process.
#ifndef TFRING_COMMON_TESTS_TCP_THREADS_H
#define TFRING_COMMON_TESTS_TCP_THREADS_H

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../transport/tcp/socket.h"
#include "../transport/tcp/tcp_communicator.h"
#include "check.h"

namespace tfring {
namespace test {

// Connects a world of `n` ranks and runs body(rank, world) on each rank's
// thread; returns when every thread has.
inline void RunThreads(int n, const tcp::TcpOptions& options,
                       const std::function<void(int, std::shared_ptr<Communicator>&)>& body) {
  std::vector<std::unique_ptr<tcp::TcpListener>> listeners(n);
  std::vector<tcp::TcpPeer> peers(n);
  for (int i = 0; i < n; ++i) {
    Status s = tcp::TcpListener::Open("127.0.0.1", 0, &listeners[i]);
    CHECK(s.ok());
    if (!s.ok()) return;
    peers[i].addr = listeners[i]->address();
    peers[i].host = "thread-host-" + std::to_string(i);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      std::shared_ptr<Communicator> world;
      Status s = tcp::ConnectTcpWorld(i, peers, std::move(listeners[i]), options, &world);
      CHECK(s.ok());
      if (!s.ok()) {
        std::fprintf(stderr, "connect: %s\n", s.message().c_str());
        return;
      }
      body(i, world);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace test
}  // namespace tfring

#endif  // TFRING_COMMON_TESTS_TCP_THREADS_H
