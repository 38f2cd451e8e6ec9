// The transports tfring can start over, in one table. Each transport's own
// file registers it once, under its TFRING_CONTROLLER name, with what makes
// its Backend (backend.h); a binding starts one by name
// (StartTransport), so the bindings include no transport's headers, and a
// new transport is its files plus one RegisterTransport line (see
// docs/architecture.md). The Python side has the matching table in
// tfring/common/transports.py.
#ifndef TFRING_COMMON_TRANSPORT_REGISTRY_H
#define TFRING_COMMON_TRANSPORT_REGISTRY_H

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "../status.h"

namespace tfring {

class Backend;  // backend.h
struct Config;  // config.h

// What a binding hands a transport besides the environment (Config).
struct TransportArgs {
  // MPI: the communicator the job runs over, as a Fortran handle (mpi4py's
  // comm.py2f()).
  int64_t fortran_comm = 0;
};

// Makes this rank's Backend; collective over the job's ranks.
using BackendMaker = Status (*)(const Config& config, const TransportArgs& args,
                                std::unique_ptr<Backend>* out);

struct TransportEntry {
  BackendMaker make = nullptr;
  // False for a transport this build left out, whose maker only explains
  // that (transport/mpi_absent.cc).
  bool built = true;
};

// Filled by the registrations' static initialisers, before any binding runs.
inline std::map<std::string, TransportEntry>& TransportTable() {
  static std::map<std::string, TransportEntry> table;
  return table;
}

// At namespace scope in the transport's own .cc:
//   const bool kRegistered = RegisterTransport("tcp", &MakeTcpBackend);
inline bool RegisterTransport(const char* name, BackendMaker make, bool built = true) {
  TransportTable()[name] = TransportEntry{make, built};
  return true;
}

// Whether this library has the transport `name`.
inline bool TransportBuilt(const std::string& name) {
  auto it = TransportTable().find(name);
  return it != TransportTable().end() && it->second.built;
}

// Starts tfring over the transport registered as `name` (lifecycle.cc).
// Idempotent while running; after shutdown() it starts afresh; after a
// failure it starts again only over a transport that can (Backend).
Status StartTransport(const std::string& name, const TransportArgs& args);

}  // namespace tfring

#endif  // TFRING_COMMON_TRANSPORT_REGISTRY_H
