#include "config.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace tfring {

const char* GetConfigEnv(const char* name) {
  for (const char* prefix : {"TFRING_", "HOROVOD_"}) {
    std::string key = std::string(prefix) + name;
    const char* v = std::getenv(key.c_str());
    if (v != nullptr && v[0] != '\0') return v;
  }
  return nullptr;
}

namespace {

bool ParseBool(const char* v) {
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return !(s == "0" || s == "false" || s == "no" || s == "off");
}

LogLevel ParseLogLevel(const char* v, LogLevel fallback) {
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  if (s == "trace") return LogLevel::TRACE;
  if (s == "debug") return LogLevel::DEBUG;
  if (s == "info") return LogLevel::INFO;
  if (s == "warning" || s == "warn") return LogLevel::WARNING;
  if (s == "error") return LogLevel::ERROR;
  if (s == "fatal") return LogLevel::FATAL;
  return fallback;
}

}  // namespace

const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::AUTO: return "auto";
    case AllreduceAlgorithm::RING: return "ring";
    case AllreduceAlgorithm::RECURSIVE_DOUBLING: return "recursive_doubling";
    case AllreduceAlgorithm::RABENSEIFNER: return "rabenseifner";
  }
  return "unknown";
}

Config Config::FromEnvironment() {
  Config c;
  if (const char* v = GetConfigEnv("FUSION_THRESHOLD")) c.fusion_threshold_bytes = std::atoll(v);
  if (const char* v = GetConfigEnv("CYCLE_TIME")) c.cycle_time_ms = std::atof(v);
  if (const char* v = GetConfigEnv("CACHE_CAPACITY")) c.cache_capacity = std::atoll(v);
  if (const char* v = GetConfigEnv("STALL_CHECK_TIME_SECONDS")) c.stall_check_time_s = std::atof(v);
  if (const char* v = GetConfigEnv("STALL_SHUTDOWN_TIME_SECONDS"))
    c.stall_shutdown_time_s = std::atof(v);
  if (const char* v = GetConfigEnv("STALL_CHECK_DISABLE")) c.stall_check_disabled = ParseBool(v);
  if (const char* v = GetConfigEnv("TIMELINE")) c.timeline_path = v;
  if (const char* v = GetConfigEnv("TIMELINE_MARK_CYCLES")) c.timeline_mark_cycles = ParseBool(v);
  if (const char* v = GetConfigEnv("LOG_LEVEL")) c.log_level = ParseLogLevel(v, c.log_level);
  if (const char* v = GetConfigEnv("LOG_TIMESTAMPS")) c.log_timestamps = ParseBool(v);
  if (const char* v = GetConfigEnv("HOSTNAME")) c.hostname = v;
  if (const char* v = GetConfigEnv("CPU_OPERATIONS")) {
    c.cpu_operations = v;
    std::transform(c.cpu_operations.begin(), c.cpu_operations.end(), c.cpu_operations.begin(),
                   ::tolower);
  }
  if (const char* v = GetConfigEnv("GPU_OPERATIONS")) {
    // Horovod's values: NCCL runs on the GPU plane; MPI, GLOO (or host)
    // send GPU tensors through the host planes.
    std::string ops = v;
    std::transform(ops.begin(), ops.end(), ops.begin(), ::tolower);
    c.gpu_operations = (ops == "mpi" || ops == "gloo" || ops == "host") ? "host" : ops;
  }
  if (const char* v = GetConfigEnv("SHM_MIN_BYTES")) c.shm_min_bytes = std::atoll(v);
  if (const char* v = GetConfigEnv("CROSS_HOST_MIN_BYTES")) c.cross_host_min_bytes = std::atoll(v);
  if (const char* v = GetConfigEnv("HIERARCHICAL_ALLREDUCE")) c.hierarchical_allreduce = ParseBool(v);
  // TFRING_ only: Horovod had no such setting (GetConfigEnv would also
  // accept a HOROVOD_ name that no Horovod script sets).
  if (const char* v = std::getenv("TFRING_ALLREDUCE_ALGORITHM")) {
    std::string name(v);
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    bool known = false;
    for (AllreduceAlgorithm a :
         {AllreduceAlgorithm::AUTO, AllreduceAlgorithm::RING,
          AllreduceAlgorithm::RECURSIVE_DOUBLING, AllreduceAlgorithm::RABENSEIFNER}) {
      if (name == AllreduceAlgorithmName(a)) {
        c.allreduce_algorithm = a;
        known = true;
      }
    }
    if (!known && !name.empty()) c.allreduce_algorithm_unknown = v;
  }
  if (const char* v = GetConfigEnv("AUTOTUNE")) c.autotune = ParseBool(v);
  if (const char* v = GetConfigEnv("XLA")) c.xla = ParseBool(v);
  if (const char* v = GetConfigEnv("AUTOTUNE_LOG")) c.autotune_log = v;
  if (const char* v = GetConfigEnv("AUTOTUNE_WARMUP_SAMPLES")) c.autotune_warmup_samples = std::atoi(v);
  if (const char* v = GetConfigEnv("AUTOTUNE_STEPS_PER_SAMPLE"))
    c.autotune_steps_per_sample = std::atoi(v);
  if (const char* v = GetConfigEnv("SECRET")) c.secret_hex = v;
  if (const char* v = GetConfigEnv("RENDEZVOUS_ADDR")) c.rendezvous_addr = v;
  if (const char* v = GetConfigEnv("RENDEZVOUS_PORT")) c.rendezvous_port = std::atoi(v);
  if (const char* v = GetConfigEnv("CONTROLLER")) {
    std::string name(v);
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    // Horovod calls its TCP controller "gloo"; ours takes that role.
    c.controller = name == "gloo" ? "tcp" : name;
  } else if (!c.rendezvous_addr.empty()) {
    c.controller = "tcp";
  }
  if (const char* v = GetConfigEnv("SIZE")) c.size = std::atoi(v);
  if (const char* v = GetConfigEnv("LOCAL_SLOT")) c.local_slot = std::atoi(v);
  if (const char* v = GetConfigEnv("HOST_ORDER")) c.host_order = std::atoi(v);
  if (const char* v = GetConfigEnv("RANK")) c.rank_hint = std::atoi(v);
  if (const char* v = GetConfigEnv("BIND_HOST")) c.bind_host = v;
  if (const char* v = GetConfigEnv("HEARTBEAT_SECONDS")) c.heartbeat_seconds = std::atof(v);
  if (const char* v = GetConfigEnv("START_TIMEOUT")) c.start_timeout_s = std::atof(v);
  if (const char* v = GetConfigEnv("RENDEZVOUS_SCOPE")) c.rendezvous_scope = v;
  if (const char* v = GetConfigEnv("SHM_SINGLE_COPY")) c.shm_single_copy = ParseBool(v);
  if (const char* v = GetConfigEnv("SHM_SINGLE_COPY_MIN_BYTES"))
    c.shm_single_copy_min_bytes = std::atoll(v);
  if (const char* v = GetConfigEnv("SPECULATION")) c.speculation = ParseBool(v);
  if (const char* v = GetConfigEnv("SPECULATION_INLINE")) c.speculation_inline = ParseBool(v);
  if (c.heartbeat_seconds <= 0) c.heartbeat_seconds = 1.0;
  if (c.start_timeout_s <= 0) c.start_timeout_s = 30.0;
  if (c.fusion_threshold_bytes < 0) c.fusion_threshold_bytes = 0;
  if (c.cycle_time_ms < 0) c.cycle_time_ms = 0;
  return c;
}

Status Config::Check() const {
  if (!allreduce_algorithm_unknown.empty()) {
    return Status::Misconfigured("tfring: TFRING_ALLREDUCE_ALGORITHM='" +
                                 allreduce_algorithm_unknown +
                                 "' names no allreduce algorithm; use auto, ring, "
                                 "recursive_doubling or rabenseifner");
  }
  return Status::OK();
}

std::string Config::HostnameFor(int rank, const std::string& real_host) const {
  if (hostname.empty()) return real_host;
  if (hostname.find(',') == std::string::npos) return hostname;
  std::vector<std::string> names;
  size_t start = 0;
  while (true) {
    size_t comma = hostname.find(',', start);
    names.push_back(hostname.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return rank < static_cast<int>(names.size()) ? names[rank] : real_host;
}

}  // namespace tfring
