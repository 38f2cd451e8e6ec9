#include "parameter_manager.h"

#include <cstdlib>

#include "logging.h"

namespace tfring {

ParameterManager::ParameterManager(const Config& config, TunableParams initial)
    : active_(config.autotune),
      warmup_left_(config.autotune_warmup_samples),
      steps_per_sample_(config.autotune_steps_per_sample < 1 ? 1 : config.autotune_steps_per_sample),
      current_(initial),
      best_(initial) {
  if (!active_) return;
  if (!config.autotune_log.empty()) {
    log_ = std::fopen(config.autotune_log.c_str(), "w");
    if (log_) {
      std::fputs("sample,stage,fusion_threshold_bytes,cycle_time_ms,shm_min_bytes,"
                 "bytes_per_second\n", log_);
      std::fflush(log_);
    } else {
      TFRING_LOG(WARNING) << "autotune: cannot write the log " << config.autotune_log;
    }
  }
  candidates_ = Candidates(stage_);
}

ParameterManager::~ParameterManager() {
  if (log_) std::fclose(log_);
}

std::vector<TunableParams> ParameterManager::Candidates(int stage) const {
  std::vector<TunableParams> out;
  TunableParams p = best_;
  switch (stage) {
    case 0:  // fusion threshold, as in Horovod's 0-64 MB range, and its 128 MB default
      for (int64_t mb : {0, 1, 4, 16, 64, 128}) {
        p.fusion_threshold_bytes = mb * 1024 * 1024;
        out.push_back(p);
      }
      break;
    case 1:
      for (double ms : {0.5, 1.0, 2.5, 5.0, 10.0, 25.0}) {
        p.cycle_time_ms = ms;
        out.push_back(p);
      }
      break;
    case 2:
      for (int64_t bytes : {int64_t{0}, int64_t{4096}, int64_t{65536}, int64_t{1} << 20}) {
        p.shm_min_bytes = bytes;
        out.push_back(p);
      }
      break;
  }
  return out;
}

void ParameterManager::Log(const char* what, const TunableParams& p, double score) {
  if (!log_) return;
  std::fprintf(log_, "%s,%d,%lld,%g,%lld,%.0f\n", what, stage_,
               static_cast<long long>(p.fusion_threshold_bytes), p.cycle_time_ms,
               static_cast<long long>(p.shm_min_bytes), score);
  std::fflush(log_);
}

void ParameterManager::RecordCycle(int64_t bytes, Clock::time_point now) {
  if (!active_ || done() || has_update_ || bytes <= 0) return;
  if (skip_next_) {
    skip_next_ = false;
    sample_start_ = now;
    return;
  }
  ++steps_;
  bytes_ += bytes;
  if (steps_ < steps_per_sample_) return;
  const double seconds = std::chrono::duration<double>(now - sample_start_).count();
  const double score = seconds > 0 ? bytes_ / seconds : 0;
  steps_ = 0;
  bytes_ = 0;
  sample_start_ = now;
  FinishSample(score);
}

void ParameterManager::FinishSample(double score) {
  if (warmup_left_ > 0) {
    --warmup_left_;
    Log("warmup", current_, score);
    return;
  }
  Log(std::to_string(++sample_index_).c_str(), current_, score);
  // The workload is the same throughout, so scores compare across stages.
  if (score > best_score_) {
    best_score_ = score;
    best_ = current_;
  }
  if (next_candidate_ >= candidates_.size()) {
    // This dimension is searched: keep its best and move on.
    ++stage_;
    if (done()) {
      Log("best", best_, best_score_);
      TFRING_LOG(INFO) << "autotune finished: fusion threshold " << best_.fusion_threshold_bytes
                       << " bytes, cycle time " << best_.cycle_time_ms << " ms, shm cut-over "
                       << best_.shm_min_bytes << " bytes";
      if (!(best_ == current_)) {
        current_ = best_;
        has_update_ = true;
      }
      return;
    }
    candidates_ = Candidates(stage_);
    next_candidate_ = 0;
  }
  current_ = candidates_[next_candidate_++];
  has_update_ = true;
}

TunableParams ParameterManager::TakeUpdate() {
  has_update_ = false;
  skip_next_ = true;
  steps_ = 0;
  bytes_ = 0;
  return current_;
}

}  // namespace tfring
