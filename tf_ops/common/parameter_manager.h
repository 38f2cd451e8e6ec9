// Autotune (TFRING_AUTOTUNE=1). On the coordinator, it scores the live
// workload in bytes reduced per second and searches the fusion threshold,
// the cycle time and the shared-memory cut-over, one parameter at a time
// over a grid of candidates (coordinate descent), keeping the best value of
// each before moving to the next. New values are sent to every rank inside
// the coordinator's response list, so all ranks switch in the same cycle.
#ifndef TFRING_COMMON_PARAMETER_MANAGER_H
#define TFRING_COMMON_PARAMETER_MANAGER_H

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "config.h"

namespace tfring {

struct TunableParams {
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  int64_t shm_min_bytes = 0;
  bool operator==(const TunableParams& o) const {
    return fusion_threshold_bytes == o.fusion_threshold_bytes &&
           cycle_time_ms == o.cycle_time_ms && shm_min_bytes == o.shm_min_bytes;
  }
};

class ParameterManager {
 public:
  using Clock = std::chrono::steady_clock;

  // `initial` holds the values in force when tuning starts.
  ParameterManager(const Config& config, TunableParams initial);
  ~ParameterManager();

  bool active() const { return active_; }
  bool done() const { return stage_ >= kStages; }
  // After a cycle on the coordinator that moved `bytes` (0: nothing ran).
  void RecordCycle(int64_t bytes, Clock::time_point now);
  // True when new values should be sent to every rank.
  bool HasUpdate() const { return has_update_; }
  TunableParams TakeUpdate();
  const TunableParams& current() const { return current_; }

 private:
  static constexpr int kStages = 3;  // fusion threshold, cycle time, shm cut-over
  std::vector<TunableParams> Candidates(int stage) const;
  void FinishSample(double score);
  void Log(const char* what, const TunableParams& p, double score);

  bool active_ = false;
  int warmup_left_;
  int steps_per_sample_;
  std::FILE* log_ = nullptr;

  TunableParams current_, best_;
  double best_score_ = -1;
  int stage_ = 0;
  std::vector<TunableParams> candidates_;
  size_t next_candidate_ = 0;
  int sample_index_ = 0;

  // The sample being measured.
  int steps_ = 0;
  int64_t bytes_ = 0;
  Clock::time_point sample_start_;
  bool skip_next_ = true;  // the first cycle after a switch runs old fusion decisions
  bool has_update_ = false;
};

}  // namespace tfring

#endif  // TFRING_COMMON_PARAMETER_MANAGER_H
