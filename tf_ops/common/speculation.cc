#include "speculation.h"

#include <algorithm>
#include <cstring>

#include "logging.h"

namespace tfring {

// --- The schedule ------------------------------------------------------------

bool Speculation::Eligible(const Response& r) {
  if (r.type != ResponseType::COLLECTIVE || r.tensor_names.empty()) return false;
  switch (r.collective) {
    case CollectiveType::ALLREDUCE:
      if (r.tensor_names.size() != r.tensor_sizes.size()) return false;
      break;
    case CollectiveType::BROADCAST:
    case CollectiveType::ALLGATHER:
      if (r.tensor_names.size() != 1) return false;
      break;
    default:
      return false;
  }
  for (int32_t d : r.devices)
    if (d != kCpuDevice) return false;
  return true;
}

bool Speculation::FlagRidesAlong(const Response& r) {
  if (r.collective != CollectiveType::ALLREDUCE) return false;
  if (r.reduce_op != ReduceOp::SUM && r.reduce_op != ReduceOp::AVERAGE) return false;
  // The flag is one element of the tensors' own type; these sum 0 and 1
  // exactly, and a NaN or Inf in the data cannot reach it.
  if (r.dtype != DataType::FLOAT32 && r.dtype != DataType::FLOAT64) return false;
  if (r.tensor_names.size() > 1) return true;
  return r.tensor_sizes[0] * DataTypeSize(r.dtype) <= kFlagRidesMaxBytes;
}

void Speculation::ResetDetector() {
  round_.clear();
  round_names_.clear();
  last_round_.clear();
  last_round_sorted_.clear();
  repeats_ = 0;
}

void Speculation::CloseRound() {
  std::vector<std::string> sorted(round_names_.begin(), round_names_.end());
  std::sort(sorted.begin(), sorted.end());
  // The same tensors as last round, in whatever order and fusion this time:
  // the order and fusion timing gave one round are as good a schedule as
  // another's, since each was one that the job's dependencies allowed.
  repeats_ = !last_round_sorted_.empty() && sorted == last_round_sorted_ ? repeats_ + 1 : 0;
  last_round_sorted_.swap(sorted);
  last_round_.swap(round_);
  round_.clear();
  round_names_.clear();
}

bool Speculation::Observe(const ResponseList& agreed, bool clean) {
  if (!clean || agreed.shutdown || agreed.has_params) {
    ResetDetector();
    return false;
  }
  for (const Response& r : agreed.responses) {
    if (!Eligible(r)) {
      ResetDetector();
      return false;
    }
    bool again = false;
    for (const auto& name : r.tensor_names) again = again || round_names_.count(name) > 0;
    if (again) CloseRound();
    round_.push_back(r);
    for (const auto& name : r.tensor_names) round_names_.insert(name);
  }
  if (agreed.responses.empty() || repeats_ + 1 < required_rounds_) return false;
  // Enter where this round stands in the schedule, if it follows it so far.
  if (round_.size() > last_round_.size()) return false;
  for (size_t i = 0; i < round_.size(); ++i) {
    if (round_[i].tensor_names != last_round_[i].tensor_names) return false;
  }
  Enter(round_.size() % last_round_.size());
  return true;
}

void Speculation::Hold(std::vector<Request> requests) {
  for (auto& r : requests) replay_.push_back(std::move(r));
}

std::vector<Request> Speculation::TakeReplay() {
  std::vector<Request> out;
  out.swap(replay_);
  return out;
}

void Speculation::Enter(size_t position) {
  schedule_ = last_round_;
  position_ = position;
  schedule_index_.clear();
  for (size_t i = 0; i < schedule_.size(); ++i) {
    for (const auto& name : schedule_[i].tensor_names) schedule_index_[name] = i;
  }
  ResetDetector();
  active_ = true;
  agreed_since_entry_ = 0;
  ++stats_.entered;
  TFRING_LOG(DEBUG) << "speculation: running a schedule of " << schedule_.size()
                    << " responses without negotiation, from position " << position_;
  waiting_since_ = std::chrono::steady_clock::now();
}

void Speculation::Cycle(const std::vector<Request>& mine, bool leave, const ResponseCache& cache,
                        ResponseList* out) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<Request> incoming;
  incoming.swap(replay_);
  incoming.insert(incoming.end(), mine.begin(), mine.end());
  bool diverged = leave || !allowed_;
  for (Request& req : incoming) {
    auto in_schedule = schedule_index_.find(req.name);
    const int bit = cache.Find(req.name);
    // The cache does not change while speculating, so its entry still holds
    // this rank's request as it was negotiated.
    if (in_schedule == schedule_index_.end() || bit < 0 || !cache.Matches(bit, req)) {
      diverged = true;
    }
    held_[req.name] = std::move(req);
  }
  ResponseList result;
  auto take = [&](const Response& r) {
    std::vector<Request> reqs;
    for (const auto& name : r.tensor_names) {
      auto it = held_.find(name);
      if (it == held_.end()) continue;
      reqs.push_back(std::move(it->second));
      held_.erase(it);
    }
    running_.push_back(std::move(reqs));
  };
  if (!diverged) {
    while (true) {
      const Response& next = schedule_[position_];
      bool ready = true;
      for (const auto& name : next.tensor_names) ready = ready && held_.count(name) > 0;
      if (!ready) break;
      take(next);
      result.responses.push_back(next);
      result.responses.back().speculative = true;
      position_ = (position_ + 1) % schedule_.size();
      waiting_since_ = now;
      // At most one pass over the schedule per cycle.
      if (result.responses.size() == schedule_.size()) break;
    }
    // Nothing for this long: leave, so that a rank that will never send the
    // schedule's next tensors (a different code path, a long pause) does
    // not hold the others in the data plane, and the stall inspector gets
    // to see what is missing.
    if (result.responses.empty() && now - waiting_since_ > patience_) diverged = true;
  }
  if (diverged && result.responses.empty()) {
    running_.push_back({});
    result.responses.push_back(schedule_[position_]);
    result.responses.back().speculative = true;
    result.responses.back().diverged = true;
  }
  // A divergence found after some responses were handed out waits for the
  // next cycle: those responses run first, with every rank.
  *out = std::move(result);
}

void Speculation::Result(SpeculationOutcome outcome) {
  if (!active_ || running_.empty()) return;
  if (outcome == SpeculationOutcome::AGREED) {
    running_.pop_front();
    ++stats_.responses;
    // A whole pass ran without a fallback: the job is steady again. (Counted
    // on agreed responses: how far ahead position_ runs is this rank's own.)
    if (++agreed_since_entry_ >= schedule_.size()) required_rounds_ = kRounds;
    return;
  }
  if (outcome == SpeculationOutcome::FAILED) {
    running_.pop_front();  // its tensors are done, with the plane's error
    ++stats_.failures;
    TFRING_LOG(DEBUG) << "speculation: the data plane failed; negotiating again";
  } else {
    ++stats_.fallbacks;
    TFRING_LOG(DEBUG) << "speculation: a rank left the schedule; negotiating again";
  }
  // The rest of what was handed out (for FLAGGED, the response itself too)
  // is negotiated afresh, in the order it was handed out, then what was held.
  std::vector<Request> back;
  for (auto& reqs : running_)
    for (auto& r : reqs) back.push_back(std::move(r));
  for (auto& kv : held_) back.push_back(std::move(kv.second));
  // Submission order is lost in held_; the names' order keeps every run alike.
  std::sort(back.begin() + (back.size() - held_.size()), back.end(),
            [](const Request& a, const Request& b) { return a.name < b.name; });
  running_.clear();
  held_.clear();
  for (auto& r : replay_) back.push_back(std::move(r));
  replay_.swap(back);
  active_ = false;
  schedule_.clear();
  schedule_index_.clear();
  ResetDetector();
  // A job that keeps leaving the schedule tries less often; a plane failure
  // says nothing about the schedule.
  if (outcome == SpeculationOutcome::FLAGGED)
    required_rounds_ = std::min(required_rounds_ * 2, kMaxRounds);
}

// --- The divergence flag in the fusion buffer ---------------------------------

Status RunSpeculativeAllreduce(Executor& executor, DataPlane& plane,
                               const std::vector<ReduceSlot>& slots, DataType dtype, ReduceOp op,
                               double prescale, double postscale, int ranks, bool diverged,
                               bool* agreed, const PhaseFn& phase) {
  *agreed = false;
  if (dtype != DataType::FLOAT32 && dtype != DataType::FLOAT64) {
    return Status::InvalidArgument(std::string("tfring: no speculative allreduce of ") +
                                   DataTypeName(dtype));
  }
  const int64_t esize = DataTypeSize(dtype);
  int64_t count = 0;
  for (const ReduceSlot& s : slots) count += s.count;
  char* buf = static_cast<char*>(executor.FusionBuffer((count + 1) * esize));
  int64_t offset = 0;
  Status s;
  for (const ReduceSlot& slot : slots) {
    const int64_t bytes = slot.count * esize;
    s = !diverged && slot.input ? executor.Copy(buf + offset, slot.input, bytes)
                                : executor.Zero(buf + offset, bytes);
    if (!s.ok()) return s;
    offset += bytes;
  }
  TFRING_RETURN_IF_ERROR(executor.Scale(buf, count, dtype, prescale));
  const float flag32 = diverged ? 1.0f : 0.0f;
  const double flag64 = diverged ? 1.0 : 0.0;
  std::memcpy(buf + offset, dtype == DataType::FLOAT32 ? static_cast<const void*>(&flag32)
                                                       : static_cast<const void*>(&flag64),
              esize);
  auto start = std::chrono::steady_clock::now();
  s = plane.Allreduce(buf, buf, count + 1, dtype, ReduceOp::SUM);
  phase(std::string(plane.last_used()) + "_" + CollectiveName(CollectiveType::ALLREDUCE), start);
  if (s.in_progress()) return Status::Unknown("tfring: a speculative allreduce was queued");
  if (!s.ok()) return s;
  double flag = 0;
  if (dtype == DataType::FLOAT32) {
    float f;
    std::memcpy(&f, buf + offset, sizeof(f));
    flag = f;
  } else {
    std::memcpy(&flag, buf + offset, sizeof(flag));
  }
  if (flag != 0) return Status::OK();  // some rank diverged: nothing is written
  *agreed = true;
  TFRING_RETURN_IF_ERROR(executor.FinishReduction(buf, count, dtype, op, postscale, ranks));
  offset = 0;
  for (const ReduceSlot& slot : slots) {
    const int64_t bytes = slot.count * esize;
    if (slot.output) TFRING_RETURN_IF_ERROR(executor.Copy(slot.output, buf + offset, bytes));
    offset += bytes;
  }
  return Status::OK();
}
}  // namespace tfring
