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
  // Device tensors too: their flag goes round on its own, on the host, and
  // the collective is then queued on the device as a negotiated one is
  // (FlagRidesAlong). Ranks agree on host or device (negotiation checked it
  // when the response was cached), so a mixed list is not one response.
  return true;
}

bool Speculation::FlagRidesAlong(const Response& r) {
  if (r.collective != CollectiveType::ALLREDUCE) return false;
  // The reduced flag is read back at once; a device plane only queues its
  // work, so its flag would not be known before the outputs are written.
  for (int32_t d : r.devices)
    if (d != kCpuDevice) return false;
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

void Speculation::Cycle(std::vector<Request>* mine, bool leave, const ResponseCache& cache,
                        ResponseList* out) {
  const auto now = std::chrono::steady_clock::now();
  // incoming_ and out's list keep their capacity from cycle to cycle (the
  // loop reuses its ResponseList): fresh vectors were allocations per
  // collective.
  std::vector<Request>& incoming = incoming_;
  incoming.clear();
  for (Request& r : replay_) incoming.push_back(std::move(r));
  replay_.clear();
  for (Request& r : *mine) incoming.push_back(std::move(r));
  mine->clear();
  bool diverged = leave || !allowed_;
  for (Request& req : incoming) {
    auto in_schedule = schedule_index_.find(req.name);
    const int bit = cache.Find(req.name);
    // The cache does not change while speculating, so its entry still holds
    // this rank's request as it was negotiated.
    if (in_schedule == schedule_index_.end() || bit < 0 || !cache.Matches(bit, req)) {
      diverged = true;
    }
    auto at = held_.find(req.name);
    if (at != held_.end()) {
      at->second = std::move(req);
    } else if (!spare_held_.empty()) {
      // A node of an earlier request: its key and request are assigned, so
      // their storage is reused (a new node was an allocation per collective).
      auto node = std::move(spare_held_.back());
      spare_held_.pop_back();
      node.key() = req.name;
      node.mapped() = std::move(req);
      held_.insert(std::move(node));
    } else {
      held_.emplace(req.name, std::move(req));
    }
  }
  incoming.clear();
  // The list's responses are assigned over those of the last cycle (their
  // vectors and strings keep their storage); only the count is new.
  std::vector<Response> reuse;
  reuse.swap(out->responses);
  *out = ResponseList();
  out->responses.swap(reuse);
  size_t used = 0;
  auto emit = [&](const Response& r) -> Response& {
    if (used < out->responses.size()) {
      out->responses[used] = r;
    } else if (!spare_responses_.empty()) {
      out->responses.push_back(std::move(spare_responses_.back()));
      spare_responses_.pop_back();
      out->responses.back() = r;
    } else {
      out->responses.push_back(r);
    }
    return out->responses[used++];
  };
  auto take = [&](const Response& r) {
    std::vector<Request> reqs;
    if (!spare_running_.empty()) {
      reqs = std::move(spare_running_.back());
      spare_running_.pop_back();
    }
    for (const auto& name : r.tensor_names) {
      auto it = held_.find(name);
      if (it == held_.end()) continue;
      reqs.push_back(std::move(it->second));
      if (spare_held_.size() < kSpares) {
        spare_held_.push_back(held_.extract(it));
      } else {
        held_.erase(it);
      }
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
      emit(next).speculative = true;
      position_ = (position_ + 1) % schedule_.size();
      waiting_since_ = now;
      // At most one pass over the schedule per cycle.
      if (used == schedule_.size()) break;
    }
    // Nothing for this long: leave, so that a rank that will never send the
    // schedule's next tensors (a different code path, a long pause) does
    // not hold the others in the data plane, and the stall inspector gets
    // to see what is missing.
    if (used == 0 && now - waiting_since_ > patience_) diverged = true;
  }
  if (diverged && used == 0) {
    running_.push_back({});
    Response& flagged = emit(schedule_[position_]);
    flagged.speculative = true;
    flagged.diverged = true;
  }
  // Responses not handed out this cycle keep their storage for later ones.
  while (out->responses.size() > used) {
    if (spare_responses_.size() < kSpares) spare_responses_.push_back(std::move(out->responses.back()));
    out->responses.pop_back();
  }
  // A divergence found after some responses were handed out waits for the
  // next cycle: those responses run first, with every rank.
}

void Speculation::RecycleFront() {
  std::vector<Request>& front = running_[running_head_];
  // These requests end here in the steady state: their storage takes the
  // next submissions (TensorTableEntry::ToRequest).
  for (Request& r : front) SpareRequests().Give(std::move(r));
  front.clear();
  // A few spares suffice: one per response a cycle hands out at a time.
  if (front.capacity() > 0 && spare_running_.size() < kSpares) {
    spare_running_.push_back(std::move(front));
  }
  if (++running_head_ == running_.size()) {
    ClearRunning();  // its slots are moved from: nothing is freed
  } else if (running_head_ >= 64 && running_head_ * 2 >= running_.size()) {
    // Never empty (pipelined submissions): slide the live part to the front
    // now and then, within the capacity it has.
    running_.erase(running_.begin(), running_.begin() + running_head_);
    running_head_ = 0;
  }
}

void Speculation::Result(SpeculationOutcome outcome) {
  if (!active_ || running_empty()) return;
  if (outcome == SpeculationOutcome::AGREED) {
    RecycleFront();
    ++stats_.responses;
    // A whole pass ran without a fallback: the job is steady again. (Counted
    // on agreed responses: how far ahead position_ runs is this rank's own.)
    if (++agreed_since_entry_ >= schedule_.size()) required_rounds_ = kRounds;
    return;
  }
  if (outcome == SpeculationOutcome::FAILED) {
    RecycleFront();  // its tensors are done, with the plane's error
    ++stats_.failures;
    TFRING_LOG(DEBUG) << "speculation: the data plane failed; negotiating again";
  } else {
    ++stats_.fallbacks;
    TFRING_LOG(DEBUG) << "speculation: a rank left the schedule; negotiating again";
  }
  // The rest of what was handed out (for FLAGGED, the response itself too)
  // is negotiated afresh, in the order it was handed out, then what was held.
  std::vector<Request> back;
  for (size_t i = running_head_; i < running_.size(); ++i)
    for (auto& r : running_[i]) back.push_back(std::move(r));
  for (auto& kv : held_) back.push_back(std::move(kv.second));
  // Submission order is lost in held_; the names' order keeps every run alike.
  std::sort(back.begin() + (back.size() - held_.size()), back.end(),
            [](const Request& a, const Request& b) { return a.name < b.name; });
  ClearRunning();
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
  if (phase) {
    phase(std::string(plane.last_used()) + "_" + CollectiveName(CollectiveType::ALLREDUCE), start);
  }
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
