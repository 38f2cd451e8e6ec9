#include "peer_monitor.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tfring {

PeerMonitor::PeerMonitor(int my_rank, const std::string& my_host, const std::vector<Peer>& peers,
                         double interval_s)
    : interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(interval_s))) {
  for (const Peer& p : peers) {
    if (p.rank != my_rank && p.host == my_host && p.pid > 0) local_.push_back(p);
  }
  std::vector<int> pids{0};
  for (const Peer& p : local_) pids.push_back(p.pid);
  // Ranks bound to a core each are not outnumbered, though each alone sees
  // one CPU: the union of everyone's masks counts.
  outnumbered_ = static_cast<int>(pids.size()) > CpusOf(pids);
}

int PeerMonitor::CpusOf(const std::vector<int>& pids) {
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int pid : pids) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(pid, sizeof set, &set) != 0) continue;
    CPU_OR(&all, &all, &set);
  }
  return CPU_COUNT(&all);
}

bool PeerMonitor::ProcessAlive(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A zombie has exited; only its parent has not collected it yet. Read into
  // a stack buffer: this runs inside a slow wait of the data planes, which
  // allocate nothing per collective (issue 38).
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;  // no /proc: trust kill()
  char buf[512];  // "pid (comm) state ...": comm is at most 16 bytes
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char* end = std::strrchr(buf, ')');  // comm may itself hold a ')'
  if (end == nullptr || end + 2 >= buf + n) return true;
  const char state = end[2];
  return state != 'Z' && state != 'X';
}

void PeerMonitor::set_on_death(std::function<void(int rank)> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  on_death_ = std::make_shared<const std::function<void(int)>>(std::move(listener));
}

void PeerMonitor::set_transport_probe(std::function<Status()> probe) {
  std::lock_guard<std::mutex> lock(mu_);
  transport_probe_ = std::make_shared<const std::function<Status()>>(std::move(probe));
}

Status PeerMonitor::Check() {
  std::shared_ptr<const std::function<void(int)>> tell;
  std::shared_ptr<const std::function<Status()>> probe;
  int dead = -1;
  Status result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok() || (local_.empty() && !transport_probe_)) return failed_;
    auto now = std::chrono::steady_clock::now();
    if (now - last_check_ < interval_) return failed_;
    last_check_ = now;
    for (const Peer& p : local_) {
      if (!ProcessAlive(p.pid)) {
        failed_ = Status::PeerFailed(
            p.rank, "tfring stopped: rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) +
            " on " + p.host +
            ") has exited or was killed while other ranks still needed it for collectives. "
            "Look at rank " + std::to_string(p.rank) + "'s own output for the cause.");
        dead = p.rank;
        tell = on_death_;
        break;
      }
    }
    result = failed_;
    if (dead < 0) probe = transport_probe_;
  }
  if (dead >= 0 && tell && *tell) (*tell)(dead);
  // Outside the lock: the transport takes its own.
  if (probe && *probe) {
    Status s = (*probe)();
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.ok()) failed_ = s;
      result = failed_;
    }
  }
  return result;
}

}  // namespace tfring
