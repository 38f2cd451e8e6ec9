#include "tcp_backend.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "../logging.h"
#include "../operations.h"
#include "../ops/data_plane_factory.h"
#include "../transport/registry.h"
#include "p2p_controller.h"
#include "../transport/tcp/rendezvous_client.h"
#include "../transport/tcp/tcp_communicator.h"
#include "../transport/tcp/topology.h"

namespace tfring {

namespace {

// Every init() in this process registers in a fresh scope of the store, so
// a job that shuts down and starts again (all ranks alike) does not collide
// with its own earlier records.
std::atomic<int> g_generation{0};

Status Missing(const char* what, const char* variable) {
  return Status::Misconfigured(std::string("tfring: the TCP controller needs ") + what +
                               " (" + variable +
                               "). tfringrun --tcp sets it; when starting ranks yourself, "
                               "export it in every rank (see docs/running.md).");
}

// The host name this rank registers under: TFRING_HOSTNAME when set (a
// comma-separated list is indexed by the rank the launcher expects).
Status RegistrationHost(const Config& config, std::string* host) {
  char real[256] = {0};
  gethostname(real, sizeof(real) - 1);
  if (config.hostname.find(',') != std::string::npos && config.rank_hint < 0) {
    return Status::Misconfigured(
        "tfring: TFRING_HOSTNAME is a list of names by rank, but under the TCP controller a "
        "rank learns its rank only after registering; give each rank its own name, or set "
        "TFRING_RANK to the rank it should take");
  }
  *host = config.HostnameFor(config.rank_hint, real);
  if (host->empty() || host->find_first_of("\n=/") != std::string::npos) {
    return Status::Misconfigured("tfring: host name '" + *host +
                                 "' cannot be registered: it is empty or contains "
                                 "a newline, '=' or '/'");
  }
  return Status::OK();
}

Status FromWire(const tcp::WireStatus& s, const std::string& what) {
  if (s.ok()) return Status::OK();
  return Status::Aborted("tfring: " + what + ": " + s.message());
}

}  // namespace

Status TcpBackend::Create(const Config& config, std::unique_ptr<TcpBackend>* out) {
  if (config.secret_hex.empty()) return Missing("the job's secret", "TFRING_SECRET");
  if (config.rendezvous_addr.empty() || config.rendezvous_port <= 0) {
    return Missing("the rendezvous store's address",
                   "TFRING_RENDEZVOUS_ADDR and TFRING_RENDEZVOUS_PORT");
  }
  if (config.size <= 0) return Missing("the number of ranks", "TFRING_SIZE");
  std::string secret;
  tcp::WireStatus ws = tcp::DecodeSecretHex(config.secret_hex, &secret);
  if (!ws.ok()) return Status::Misconfigured("tfring: TFRING_SECRET: " + ws.message());
  std::string host;
  TFRING_RETURN_IF_ERROR(RegistrationHost(config, &host));

  const double timeout = config.start_timeout_s;
  std::unique_ptr<tcp::TcpListener> listener;
  TFRING_RETURN_IF_ERROR(tcp::TcpListener::Open(config.bind_host, 0, &listener));

  // The store may not be up yet (rank 0 starts it with
  // TFRING_RENDEZVOUS_SERVE=1, a driver may be slower than its workers):
  // connecting is retried until the start-up timeout.
  tcp::RendezvousClient store;
  const auto give_up = tcp::After(timeout);
  while (true) {
    ws = store.Connect(config.rendezvous_addr, config.rendezvous_port, secret, timeout);
    const bool retry = ws.cause() == tcp::WireCause::PEER_CLOSED ||
                       ws.cause() == tcp::WireCause::IO_ERROR;
    if (ws.ok() || !retry || tcp::Clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  TFRING_RETURN_IF_ERROR(FromWire(ws, "cannot reach the rendezvous store"));
  // The counter advances either way, so that a process that once ran
  // elastically and then not numbers its scopes like its peers.
  const int generation = g_generation.fetch_add(1);
  if (config.rendezvous_scope.size() > 256) {
    return Status::Misconfigured("tfring: TFRING_RENDEZVOUS_SCOPE is longer than the "
                                 "store's 256-byte scope limit");
  }
  const std::string scope = config.rendezvous_scope.empty()
                                ? "job/" + std::to_string(generation)
                                : config.rendezvous_scope;
  tcp::Registration reg;
  reg.host = host;
  reg.pid = getpid();
  // A listener on every interface is advertised by the address this rank
  // reaches the store from: host names of fake or container hosts need not
  // resolve, and that interface is the one the other ranks route to.
  const std::string listen_host = listener->host();
  std::string advertised = listen_host;
  if (listen_host.empty() || listen_host == "0.0.0.0" || listen_host == "::") {
    advertised = store.LocalAddress();
  }
  reg.addr = advertised + ":" + std::to_string(listener->port());
  reg.order = config.host_order;
  reg.slot = config.local_slot;
  if (reg.slot < 0) {
    // Ranks started without a launcher take the next free slot on their host.
    int64_t taken = 0;
    TFRING_RETURN_IF_ERROR(
        FromWire(store.Add(scope, "slots/" + host, 1, &taken), "cannot take a slot"));
    reg.slot = taken - 1;
  }
  const std::string key = "reg/" + host + "/" + std::to_string(reg.slot);
  ws = store.Set(scope, key, tcp::EncodeRegistration(reg), /*exclusive=*/true);
  if (ws.cause() == tcp::WireCause::INVALID_ARGUMENT) {
    return Status::Misconfigured("tfring: slot " + std::to_string(reg.slot) + " on host " +
                                 host + " is already taken by another rank of this job "
                                 "(two ranks with the same TFRING_LOCAL_SLOT?)");
  }
  TFRING_RETURN_IF_ERROR(FromWire(ws, "cannot register"));
  std::vector<std::pair<std::string, std::string>> entries;
  ws = store.WaitPrefix(scope, "reg/", static_cast<uint32_t>(config.size), timeout, &entries);
  if (ws.cause() == tcp::WireCause::TIMEOUT) {
    return Status::Timeout("tfring: only some of the " + std::to_string(config.size) +
                           " ranks registered within " + std::to_string(static_cast<int>(timeout)) +
                           " s (TFRING_START_TIMEOUT): " + ws.message());
  }
  TFRING_RETURN_IF_ERROR(FromWire(ws, "waiting for the other ranks"));
  store.Close();
  if (static_cast<int>(entries.size()) != config.size) {
    return Status::Misconfigured(
        "tfring: " + std::to_string(entries.size()) + " ranks registered, but TFRING_SIZE is " +
        std::to_string(config.size) + "; every rank must be given the same size");
  }
  std::vector<tcp::Registration> regs(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    ws = tcp::DecodeRegistration(entries[i].second, entries[i].first, &regs[i]);
    if (!ws.ok()) return Status::Misconfigured("tfring: " + ws.message());
  }
  std::vector<tcp::RankInfo> ranks;
  ws = tcp::DeriveTopology(regs, &ranks);
  if (!ws.ok()) return Status::Misconfigured("tfring: " + ws.message());
  int me = -1;
  std::vector<tcp::TcpPeer> peers(ranks.size());
  for (const tcp::RankInfo& info : ranks) {
    peers[info.rank] = tcp::TcpPeer{info.reg.addr, info.reg.host};
    if (info.reg.host == host && info.reg.slot == reg.slot) me = info.rank;
  }
  if (me < 0) return Status::Aborted("tfring: this rank's registration is missing from the store");

  tcp::TcpOptions options;
  options.secret = secret;
  options.heartbeat_seconds = config.heartbeat_seconds;
  options.connect_timeout = timeout;
  std::unique_ptr<TcpBackend> backend(new TcpBackend());
  TFRING_RETURN_IF_ERROR(tcp::ConnectTcpWorld(me, peers, std::move(listener), options,
                                              &backend->world_));
  TFRING_LOG(DEBUG) << "TCP transport: rank " << me << " of " << config.size << " connected";
  *out = std::move(backend);
  return Status::OK();
}

Status TcpBackend::CreateProcessSet(ProcessSet* set, const Config& config) {
  const bool member = std::find(set->ranks.begin(), set->ranks.end(), rank()) != set->ranks.end();
  std::shared_ptr<Communicator> comm;
  if (static_cast<int>(set->ranks.size()) == size()) {
    TFRING_RETURN_IF_ERROR(world_->Dup(&comm));
  } else {
    TFRING_RETURN_IF_ERROR(world_->Split(member ? 0 : -1, rank(), &comm));
    if (!member) return Status::OK();
  }
  set->rank = comm->rank();
  // Negotiation gets its own channel: its tags repeat every cycle.
  std::shared_ptr<Communicator> negotiation;
  TFRING_RETURN_IF_ERROR(comm->Dup(&negotiation));
  set->controller.reset(new P2PController(negotiation, set->ranks, config));
  std::vector<std::string> hosts;
  if (!hosts_.empty()) {
    for (int r : set->ranks) hosts.push_back(hosts_[r]);
  }
  set->data_plane = MakeDataPlane(comm, nullptr, hosts, config, rank());
  if (!set->data_plane) {
    return Status::Aborted("tfring: no data plane could be made for process set " +
                           std::to_string(set->id) + " over TCP (see the log above)");
  }
  return Status::OK();
}

namespace {

Status MakeTcpBackend(const Config& config, const TransportArgs&, std::unique_ptr<Backend>* out) {
  std::unique_ptr<TcpBackend> backend;
  TFRING_RETURN_IF_ERROR(TcpBackend::Create(config, &backend));
  *out = std::move(backend);
  return Status::OK();
}

const bool kRegistered = RegisterTransport("tcp", &MakeTcpBackend);

}  // namespace

}  // namespace tfring
