// init() and shutdown(), and what they leave behind: whether tfring runs,
// the job's topology, and whether it may start again (operations.h).
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "background_loop.h"
#include "device_watchdog.h"
#include "global_state.h"
#include "gpu_support.h"
#include "logging.h"
#include "operations.h"
#include "transport/registry.h"

namespace tfring {

namespace {

// The init/shutdown transitions, this file's alone: one at a time (mu),
// whether a job runs here, and its background thread. Never destroyed, as
// state() (global_state.h).
struct Lifecycle {
  std::mutex mu;
  std::atomic<bool> running{false};
  std::thread background;
};

Lifecycle& lifecycle() {
  static Lifecycle* l = new Lifecycle();
  return *l;
}

// Under lifecycle().mu: whether tfring runs, else whether it may start again.
Status CheckCanStartLocked(bool* running) {
  GlobalState& st = state();
  Lifecycle& lc = lifecycle();
  {
    std::lock_guard<std::mutex> elock(st.gate.mu);
    *running = lc.running && !st.gate.stopped;
    if (*running) return Status::OK();
  }
  // The previous job ended (shutdown() here, or another rank stopped it).
  if (lc.background.joinable()) lc.background.join();
  if (st.comm_broken && !st.broken_can_restart) {
    // Still the failure that broke it (its cause and rank), in other words.
    return Status::Make(StatusCode::ABORTED, st.gate.stopped_status.cause(),
                        "tfring cannot start again in this process: communication broke "
                        "down earlier, and the " + st.broken_backend +
                        " transport cannot recover from that (" + st.gate.stopped_status.message() +
                        ")",
                        st.gate.stopped_status.rank());
  }
  return Status::OK();
}

}  // namespace

Status CheckCanStart(bool* running) {
  std::lock_guard<std::mutex> lock(lifecycle().mu);
  return CheckCanStartLocked(running);
}

Status Initialize(std::unique_ptr<Backend> backend, const Config& config) {
  GlobalState& st = state();
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mu);
  bool running = false;
  TFRING_RETURN_IF_ERROR(CheckCanStartLocked(&running));
  if (running) return Status::OK();
  if (!backend) return Status::InvalidArgument("tfring: Initialize() needs a backend");

  st.config = config;
  st.shutdown.Reset();
  SetLogging(st.config.log_level, st.config.log_timestamps, backend->rank());
  // A first global set, on the fallback plane only, learns the topology; the
  // real one is then built knowing which ranks share a host (for shared
  // memory and the cross-host planes).
  auto bootstrap = std::make_shared<ProcessSet>();
  for (int r = 0; r < backend->size(); ++r) bootstrap->ranks.push_back(r);
  TFRING_RETURN_IF_ERROR(backend->CreateProcessSet(bootstrap.get(), st.config));
  Topology topo;
  std::vector<PeerMonitor::Peer> peers;
  std::string real_host;
  std::vector<std::string> hosts;
  TFRING_RETURN_IF_ERROR(
      ComputeTopology(*bootstrap, st.config, &topo, &peers, &real_host, &hosts));
  auto monitor = std::make_shared<PeerMonitor>(topo.rank, real_host, peers);
  backend->set_peer_monitor(monitor);
  // The device watchdog watches the same peers while device work runs, and
  // stops the job (as the loop would) when one dies under it.
  Watchdog().Arm({monitor, AbortGpuWork, StopForDeviceFailure});
  backend->set_hosts(hosts);
  auto global = std::make_shared<ProcessSet>();
  global->id = kGlobalProcessSetId;
  global->ranks = bootstrap->ranks;
  TFRING_RETURN_IF_ERROR(backend->CreateProcessSet(global.get(), st.config));
  bootstrap.reset();

  if (topo.rank == 0 && !st.config.timeline_path.empty()) {
    TFRING_RETURN_IF_ERROR(st.timeline.Start(st.config.timeline_path, st.config.timeline_mark_cycles));
  }
  global->controller->set_timeline(&st.timeline);
  st.cycle_time_ms = st.config.cycle_time_ms;
  st.fusion_threshold_bytes = st.config.fusion_threshold_bytes;
  st.shm_min_bytes = st.config.shm_min_bytes;
  st.tuner.reset();
  if (topo.rank == 0 && st.config.autotune) {
    TunableParams initial{st.config.fusion_threshold_bytes, st.config.cycle_time_ms,
                          st.config.shm_min_bytes};
    st.tuner.reset(new ParameterManager(st.config, initial));
  }
  st.topo = topo;
  // Communication works again (a restartable backend after a failure).
  st.comm_broken = false;
  st.broken_can_restart = false;
  st.broken_backend.clear();
  st.backend = std::move(backend);
  st.process_sets.Clear();
  st.process_sets.Add(global);
  {
    std::lock_guard<std::mutex> elock(st.gate.mu);
    st.gate.stopped = false;
    st.gate.stopped_status = Status::OK();
  }
  st.gate.ever_initialized = true;
  lc.running = true;
  lc.background = std::thread(BackgroundLoop);
  TFRING_LOG(DEBUG) << "initialised over " << st.backend->name() << ": size " << topo.size
                    << ", local rank " << topo.local_rank << " of " << topo.local_size;
  return Status::OK();
}

Status Shutdown(const std::string& reason) {
  GlobalState& st = state();
  Lifecycle& lc = lifecycle();
  std::lock_guard<std::mutex> lock(lc.mu);
  if (!lc.running) return Status::OK();
  RequestShutdown(FailureCause::SHUTDOWN,
                  "rank " + std::to_string(st.topo.rank) +
                      (reason.empty() ? " called shutdown() (or its script ended)" : " " + reason),
                  st.topo.rank);
  if (lc.background.joinable()) lc.background.join();
  {
    std::lock_guard<std::mutex> elock(st.gate.mu);
    st.gate.stopped_status = Status::NotInitialized(
        "tfring has been shut down on this rank (shutdown() was called); call init() to start it "
        "again.");
  }
  lc.running = false;
  return Status::OK();
}

bool IsInitialized() {
  GlobalState& st = state();
  std::lock_guard<std::mutex> lock(st.gate.mu);
  return lifecycle().running && !st.gate.stopped;
}

Status CheckInitialized() {
  GlobalState& st = state();
  std::lock_guard<std::mutex> lock(st.gate.mu);
  if (!st.gate.ever_initialized) {
    return Status::NotInitialized("tfring has not been initialized; use hvd.init().");
  }
  if (st.gate.stopped) return st.gate.stopped_status;
  return Status::OK();
}

Status CheckTopologyKnown() {
  GlobalState& st = state();
  std::lock_guard<std::mutex> lock(st.gate.mu);
  if (!st.gate.ever_initialized) {
    return Status::NotInitialized("tfring has not been initialized; use hvd.init().");
  }
  return Status::OK();
}

int Rank() { return state().topo.rank; }
int Size() { return state().topo.size; }
int LocalRank() { return state().topo.local_rank; }
int LocalSize() { return state().topo.local_size; }
int CrossRank() { return state().topo.cross_rank; }
int CrossSize() { return state().topo.cross_size; }
bool IsHomogeneous() { return state().topo.homogeneous; }
bool CommunicationBroken() { return state().comm_broken; }

bool MPIThreadsSupported() {
  GlobalState& st = state();
  return st.backend && st.backend->threads_supported();
}

Status StartTransport(const std::string& name, const TransportArgs& args) {
  auto it = TransportTable().find(name);
  if (it == TransportTable().end()) {
    return Status::Misconfigured("tfring: this library has no transport named '" + name + "'");
  }
  std::unique_ptr<Backend> backend;
  // A transport this build left out only explains that.
  if (!it->second.built) return it->second.make(Config(), args, &backend);
  // Decided before the backend exists: making one is collective (MPI
  // duplicates its communicator, TCP registers with the store), which would
  // wait for ranks that never come while tfring runs, and may hang when the
  // communication broke earlier.
  bool running = false;
  TFRING_RETURN_IF_ERROR(CheckCanStart(&running));
  if (running) return Status::OK();
  const Config config = Config::FromEnvironment();
  // Refused before the backend exists, so no rank waits for one that stopped.
  TFRING_RETURN_IF_ERROR(config.Check());
  TFRING_RETURN_IF_ERROR(it->second.make(config, args, &backend));
  return Initialize(std::move(backend), config);
}

}  // namespace tfring
