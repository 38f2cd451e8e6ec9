// Runtime configuration. This is the one place that reads environment
// variables: each knob is TFRING_<NAME>, with HOROVOD_<NAME> accepted as an
// alias so existing Horovod launch scripts keep their tuning.
#ifndef TFRING_COMMON_CONFIG_H
#define TFRING_COMMON_CONFIG_H

#include <cstdint>
#include <string>

#include "status.h"

namespace tfring {

enum class LogLevel : int { TRACE = 0, DEBUG = 1, INFO = 2, WARNING = 3, ERROR = 4, FATAL = 5 };

// Which allreduce a ring data plane runs (ops/allreduce_algorithms.h):
// AUTO chooses per message from the plane's measured link costs.
enum class AllreduceAlgorithm : int { AUTO = 0, RING, RECURSIVE_DOUBLING, RABENSEIFNER };
// "auto", "ring", "recursive_doubling", "rabenseifner".
const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm);

struct Config {
  int64_t fusion_threshold_bytes = 128LL * 1024 * 1024;
  double cycle_time_ms = 1.0;
  int64_t cache_capacity = 1024;
  double stall_check_time_s = 60.0;
  double stall_shutdown_time_s = 0.0;  // 0: never turn a stall into an error
  bool stall_check_disabled = false;
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  LogLevel log_level = LogLevel::WARNING;
  bool log_timestamps = false;
  // Overrides the host name used to group ranks into hosts (local_rank etc.);
  // lets tests fake several hosts on one machine. A comma-separated list is
  // indexed by rank ("a,a,b,b": ranks 0-1 on host a, 2-3 on host b).
  std::string hostname;
  // Which data planes CPU collectives may use: auto (shared memory within a
  // host, ring across hosts, the transport's fallback plane for the rest),
  // mpi (the fallback plane only: MPI's, or a ring over TCP), shm or ring.
  std::string cpu_operations = "auto";
  // In auto mode, the smallest message (bytes) sent through shared memory,
  // and through the ring/hierarchical plane across hosts.
  // GPU tensors: "auto" (NCCL when every rank of a host has a GPU of its
  // own, else host staging), "nccl", or "host" (always host staging).
  std::string gpu_operations = "auto";
  int64_t shm_min_bytes = 0;
  int64_t cross_host_min_bytes = 0;
  // Across hosts, reduce within each host first (hierarchical) instead of
  // one flat ring.
  bool hierarchical_allreduce = false;
  // TFRING_ALLREDUCE_ALGORITHM: what the ring-based planes run for an
  // allreduce. Horovod had no such knob, so there is no HOROVOD_ alias. A
  // name that is none of the algorithms is kept in
  // allreduce_algorithm_unknown for Check() to refuse.
  AllreduceAlgorithm allreduce_algorithm = AllreduceAlgorithm::AUTO;
  std::string allreduce_algorithm_unknown;
  // Autotune (see parameter_manager.h).
  bool autotune = false;
  // TFRING_XLA (alias HOROVOD_XLA): 0 keeps Keras from compiling the train
  // step of a model with a DistributedOptimizer with XLA (tfring/keras/xla.py);
  // the collectives' XLA kernels stay registered for explicit jit_compile.
  bool xla = true;
  std::string autotune_log;
  int autotune_warmup_samples = 3;
  int autotune_steps_per_sample = 10;

  // --- Transport (see docs/running.md, "The TCP transport").
  // "mpi" or "tcp": which backend init() starts. HOROVOD_CONTROLLER=gloo
  // means tcp; unset means tcp when a rendezvous address is given, else mpi.
  std::string controller = "mpi";
  // The job's secret, hex (TFRING_SECRET). Only the environment carries it.
  std::string secret_hex;
  // Where the rendezvous store listens (TFRING_RENDEZVOUS_ADDR/PORT).
  std::string rendezvous_addr;
  int rendezvous_port = 0;
  // Ranks in the job (TFRING_SIZE, HOROVOD_SIZE): how many registrations to wait for.
  int size = 0;
  // This rank's slot on its host, and its host's index in the launcher's
  // host list; -1 = not given (the slot is then taken from the store).
  int local_slot = -1;
  int host_order = -1;
  // The job-wide rank the launcher expects this process to get, -1 if none:
  // only used to pick this rank's name from a comma-separated TFRING_HOSTNAME.
  int rank_hint = -1;
  // Address the rank's own listening socket binds to: loopback for a
  // single-host job, an interface's address with --network-interfaces.
  std::string bind_host;
  // Heartbeat interval between ranks; a peer silent for 3 intervals is dead.
  double heartbeat_seconds = 1.0;
  // Bound on the whole start-up (registration, waiting for every rank, connecting).
  double start_timeout_s = 30.0;
  // The store scope this rank registers in (TFRING_RENDEZVOUS_SCOPE). Empty:
  // a fresh "job/<n>" per init() of this process. An elastic driver names
  // each round's scope, because the processes of a round have each started
  // a different number of times and no per-process counter agrees.
  std::string rendezvous_scope;
  // Whether the shared-memory plane may let a rank read another's memory
  // directly (process_vm_readv) for large broadcasts and allgathers
  // (TFRING_SHM_SINGLE_COPY, off by default: see shm_data_plane.cc), and
  // from how many bytes (TFRING_SHM_SINGLE_COPY_MIN_BYTES; negative: the
  // plane chooses).
  bool shm_single_copy = false;
  int64_t shm_single_copy_min_bytes = -1;
  // Skip negotiation in the steady state (controller.h, speculation):
  // TFRING_SPECULATION=0 turns it off, e.g. to measure against.
  bool speculation = true;
  // In speculative mode, a thread that submits a tensor runs the schedule's
  // next responses itself when no other thread drives (background_loop.cc,
  // DriveInline); TFRING_SPECULATION_INLINE=0 leaves it to the background
  // thread.
  bool speculation_inline = true;

  // The host name this rank uses for topology, given the job-wide rank.
  std::string HostnameFor(int rank, const std::string& real_host) const;

  static Config FromEnvironment();
  // Misconfigured naming the variable when a setting cannot be used; init()
  // refuses to start on it (every rank reads the same environment, so every
  // rank refuses alike, before any collective).
  Status Check() const;
};

// TFRING_<name>, else HOROVOD_<name>, else nullptr.
const char* GetConfigEnv(const char* name);

}  // namespace tfring

#endif  // TFRING_COMMON_CONFIG_H
