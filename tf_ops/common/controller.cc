#include "controller.h"

#include <algorithm>
#include <set>

#include "logging.h"

namespace tfring {

Controller::Controller(int rank, std::vector<int> global_ranks, const Config& config)
    : rank_(rank),
      global_ranks_(std::move(global_ranks)),
      fusion_threshold_(config.fusion_threshold_bytes),
      joined_(global_ranks_.size(), false),
      cache_(static_cast<int>(config.cache_capacity)),
      hit_patience_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(std::max(
              0.5, std::min({config.stall_check_time_s,
                             config.stall_shutdown_time_s > 0 ? config.stall_shutdown_time_s
                                                              : 10.0,
                             10.0}) / 2)))),
      speculation_(hit_patience_) {}

namespace {
void SetBit(std::vector<uint64_t>& words, size_t offset, int bit) {
  words[offset + bit / 64] |= uint64_t{1} << (bit % 64);
}
bool GetBit(const std::vector<uint64_t>& words, size_t offset, int bit) {
  return (words[offset + bit / 64] >> (bit % 64)) & 1;
}
}  // namespace

std::vector<Request> Controller::StageGroups(const std::vector<Request>& requests) {
  std::vector<Request> out;
  for (const Request& req : requests) {
    if (req.group_size <= 1) {
      out.push_back(req);
      continue;
    }
    // Kernels submit a group's members one by one, so a cycle may see only
    // some of them: hold those back until the rest arrive, so that the group
    // is decided (all hits, or all to the coordinator) as a whole.
    auto& members = arriving_groups_[req.group_name];
    members.push_back(req);
    // An abandoned member means the rest never come from this rank: what
    // arrived goes now, and the coordinator fails the group everywhere.
    if (static_cast<int>(members.size()) >= req.group_size || !req.abandoned.empty()) {
      out.insert(out.end(), members.begin(), members.end());
      arriving_groups_.erase(req.group_name);
    }
  }
  return out;
}

Status Controller::ComputeResponseList(RequestList&& mine, ResponseList* out) {
  if (cache_.enabled() && speculation_.active()) return SpeculativeCycle(&mine, out);
  return ComputeResponseList(static_cast<const RequestList&>(mine), out);
}

Status Controller::ComputeResponseList(const RequestList& mine, ResponseList* out) {
  if (!cache_.enabled()) {
    for (const Request& r : mine.requests) negotiating_[r.name] = r;
    TFRING_RETURN_IF_ERROR(NegotiateWithCoordinator(mine, out));
    for (const Response& r : out->responses)
      for (const auto& name : r.tensor_names) negotiating_.erase(name);
    return Status::OK();
  }
  if (speculation_.active()) {
    RequestList copy = mine;
    return SpeculativeCycle(&copy, out);
  }
  const auto now = std::chrono::steady_clock::now();
  RequestList full;
  full.shutdown = mine.shutdown;
  full.shutdown_reason = mine.shutdown_reason;
  full.shutdown_cause = mine.shutdown_cause;
  full.shutdown_rank = mine.shutdown_rank;
  full.requests.swap(deferred_);
  // After a fallback, what speculation held is negotiated first.
  std::vector<Request> incoming = speculation_.TakeReplay();
  incoming.insert(incoming.end(), mine.requests.begin(), mine.requests.end());

  const int capacity = cache_.capacity();
  const size_t words_per_part = (capacity + 63) / 64;
  // [0]: bit 0 clear if this rank needs the coordinator this cycle;
  // [hits]: cache hits this rank has ready; [valid]: bits this rank did NOT
  // find stale. AND over ranks gives "nobody needs the coordinator", "ready
  // everywhere" and "stale somewhere" (by its complement).
  const size_t hits = 1, valid = 1 + words_per_part;
  std::vector<uint64_t> words(1 + 2 * words_per_part, 0);
  std::fill(words.begin() + valid, words.end(), ~uint64_t{0});

  auto invalidate = [&](int bit) { words[valid + bit / 64] &= ~(uint64_t{1} << (bit % 64)); };
  std::vector<std::pair<int, Request>> new_hits;
  for (const Request& req : StageGroups(incoming)) {
    if (req.type == CollectiveType::JOIN) join_pending_ = true;
    if (ResponseCache::Cacheable(req.type)) {
      int bit = cache_.Find(req.name);
      if (bit >= 0 && cache_.Matches(bit, req)) {
        new_hits.push_back({bit, req});
        continue;
      }
      // Cached with another shape or op: every rank drops the entry.
      if (bit >= 0) invalidate(bit);
    }
    full.requests.push_back(req);
  }
  for (auto it = pending_hits_.begin(); it != pending_hits_.end();) {
    if (now - it->second.since > hit_patience_) {
      full.requests.push_back(it->second.request);
      invalidate(it->first);
      it = pending_hits_.erase(it);
    } else {
      ++it;
    }
  }
  // A group runs as one: the coordinator releases it only once it has every
  // member, so a group with any member on its way to the coordinator sends
  // all of them there. Its cached members are invalidated too, which makes
  // every other rank drop its hits on them and negotiate the whole group as
  // well; otherwise they would run from the cache and the coordinator would
  // wait forever for them.
  std::set<std::string> negotiated_groups;
  for (const Request& r : full.requests) {
    if (r.group_size > 1) negotiated_groups.insert(r.group_name);
  }
  auto negotiated = [&](const Request& r) {
    return r.group_size > 1 && negotiated_groups.count(r.group_name) > 0;
  };
  for (auto& hit : new_hits) {
    if (negotiated(hit.second)) {
      full.requests.push_back(hit.second);
      invalidate(hit.first);
    } else {
      pending_hits_[hit.first] = {std::move(hit.second), now};
    }
  }
  for (auto it = pending_hits_.begin(); it != pending_hits_.end();) {
    if (negotiated(it->second.request)) {
      full.requests.push_back(it->second.request);
      invalidate(it->first);
      it = pending_hits_.erase(it);
    } else {
      SetBit(words, hits, it->first);
      ++it;
    }
  }
  if (join_pending_) {
    // A joined rank takes part in every cached allreduce (with zeros); other
    // cached collectives cannot run while it has joined, so it marks them
    // stale and the ranks that want them get the coordinator's error.
    for (int bit = 0; bit < capacity; ++bit) {
      if (!cache_.Valid(bit)) continue;
      if (cache_.Peek(bit).collective == CollectiveType::ALLREDUCE) {
        SetBit(words, hits, bit);
      } else {
        words[valid + bit / 64] &= ~(uint64_t{1} << (bit % 64));
      }
    }
  }
  const bool must_negotiate =
      !full.requests.empty() || full.shutdown || params_to_send_.has_params;
  // Bit 0: nobody needs the coordinator. Bit 1: nobody vetoes speculation.
  words[0] = (must_negotiate ? 0 : 1) | (LocallyReadyToSpeculate() ? 2 : 0);
  TFRING_RETURN_IF_ERROR(AllreduceBitsAnd(&words));
  const bool clean_round = (words[0] & 3) == 3;

  ResponseList result;
  std::vector<Response> cached;
  for (int bit = 0; bit < capacity; ++bit) {
    if (!GetBit(words, valid, bit)) {
      auto it = pending_hits_.find(bit);
      if (it != pending_hits_.end()) {
        deferred_.push_back(it->second.request);
        pending_hits_.erase(it);
      }
      cache_.Evict(bit);
    } else if (GetBit(words, hits, bit) && cache_.Valid(bit)) {
      cached.push_back(cache_.Use(bit));
      pending_hits_.erase(bit);
    }
  }
  result.responses = Fuse(std::move(cached), fusion_threshold_);

  if ((words[0] & 1) == 0) {
    for (const Request& r : full.requests) negotiating_[r.name] = r;
    ResponseList negotiated;
    TFRING_RETURN_IF_ERROR(NegotiateWithCoordinator(full, &negotiated));
    UpdateCache(negotiated);
    result.shutdown = negotiated.shutdown;
    result.shutdown_reason = negotiated.shutdown_reason;
    result.shutdown_cause = negotiated.shutdown_cause;
    result.shutdown_rank = negotiated.shutdown_rank;
    result.has_params = negotiated.has_params;
    result.fusion_threshold_bytes = negotiated.fusion_threshold_bytes;
    result.cycle_time_ms = negotiated.cycle_time_ms;
    result.shm_min_bytes = negotiated.shm_min_bytes;
    for (auto& r : negotiated.responses) result.responses.push_back(std::move(r));
  }
  FeedDetector(result, clean_round);
  *out = std::move(result);
  return Status::OK();
}

// --- Speculation (speculation.h) ---------------------------------------------

bool Controller::LocallyReadyToSpeculate() const {
  // Anything on its way through the coordinator, a join, or a group being
  // assembled means this rank is not in a steady state.
  return speculation_.allowed() && cache_.enabled() && !join_pending_ && negotiating_.empty() &&
         deferred_.empty() && arriving_groups_.empty() && !speculation_.has_replay() &&
         (!is_coordinator() || pending_.empty());
}

void Controller::FeedDetector(const ResponseList& agreed, bool clean) {
  if (!speculation_.Observe(agreed, clean)) return;
  // Hits this rank holds that the others have not matched yet are held for
  // the schedule (or make this rank diverge if they are not in it).
  std::vector<Request> hits;
  for (auto& hit : pending_hits_) hits.push_back(std::move(hit.second.request));
  pending_hits_.clear();
  speculation_.Hold(std::move(hits));
}

Status Controller::SpeculativeCycle(RequestList* mine, ResponseList* out) {
  speculation_.Cycle(&mine->requests, mine->shutdown || params_to_send_.has_params, cache_, out);
  return Status::OK();
}

void Controller::UpdateCache(const ResponseList& negotiated) {
  for (const Response& r : negotiated.responses) {
    if (r.collective == CollectiveType::JOIN && r.type == ResponseType::COLLECTIVE) {
      join_pending_ = false;
      // The join response names no tensor: its request is settled here.
      for (auto it = negotiating_.begin(); it != negotiating_.end();) {
        it = it->second.type == CollectiveType::JOIN ? negotiating_.erase(it) : std::next(it);
      }
    }
    const bool cacheable = r.type == ResponseType::COLLECTIVE && ResponseCache::Cacheable(r.collective);
    for (const Response& single : SplitResponse(r)) {
      const std::string& name = single.tensor_names.empty() ? "" : single.tensor_names[0];
      auto mine = negotiating_.find(name);
      if (cacheable) cache_.Put(single, mine == negotiating_.end() ? nullptr : &mine->second);
      if (mine != negotiating_.end()) negotiating_.erase(mine);
    }
    if (!cacheable) {
      for (const auto& name : r.tensor_names) negotiating_.erase(name);
    }
  }
  // Slots may have been reused for other tensors: a hit that no longer
  // matches its slot is negotiated afresh next cycle.
  for (auto it = pending_hits_.begin(); it != pending_hits_.end();) {
    if (!cache_.Matches(it->first, it->second.request)) {
      deferred_.push_back(it->second.request);
      it = pending_hits_.erase(it);
    } else {
      ++it;
    }
  }
}

Status Controller::NegotiateWithCoordinator(const RequestList& mine, ResponseList* out) {
  std::vector<std::string> all;
  TFRING_RETURN_IF_ERROR(GatherRequests(SerializeRequestList(mine), &all));
  std::string bytes;
  if (is_coordinator()) {
    for (int r = 0; r < static_cast<int>(all.size()); ++r) {
      RequestList list;
      TFRING_RETURN_IF_ERROR(ParseRequestList(all[r], &list));
      Ingest(list, r);
    }
    bytes = SerializeResponseList(BuildResponseList());
  }
  TFRING_RETURN_IF_ERROR(BroadcastResponses(&bytes));
  return ParseResponseList(bytes, out);
}

}  // namespace tfring
