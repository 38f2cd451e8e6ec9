#include "controller.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

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
    if (static_cast<int>(members.size()) >= req.group_size) {
      out.insert(out.end(), members.begin(), members.end());
      arriving_groups_.erase(req.group_name);
    }
  }
  return out;
}

Status Controller::ComputeResponseList(const RequestList& mine, ResponseList* out) {
  if (!cache_.enabled()) {
    for (const Request& r : mine.requests) negotiating_[r.name] = r;
    TFRING_RETURN_IF_ERROR(NegotiateWithCoordinator(mine, out));
    for (const Response& r : out->responses)
      for (const auto& name : r.tensor_names) negotiating_.erase(name);
    return Status::OK();
  }
  if (speculation_.active()) return SpeculativeCycle(mine, out);
  const auto now = std::chrono::steady_clock::now();
  RequestList full;
  full.shutdown = mine.shutdown;
  full.shutdown_reason = mine.shutdown_reason;
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

Status Controller::SpeculativeCycle(const RequestList& mine, ResponseList* out) {
  speculation_.Cycle(mine.requests, mine.shutdown || params_to_send_.has_params, cache_, out);
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

void Controller::Ingest(const RequestList& list, int from_rank) {
  if (list.shutdown && !shutdown_) {
    shutdown_ = true;
    shutdown_reason_ = list.shutdown_reason;
  }
  for (const Request& req : list.requests) {
    if (req.type == CollectiveType::JOIN) {
      if (!joined_[from_rank]) {
        joined_[from_rank] = true;
        ++num_joined_;
      }
      last_joined_ = global_ranks_[from_rank];
      continue;
    }
    auto it = pending_.find(req.name);
    if (it == pending_.end()) {
      PendingTensor p;
      p.requests.resize(size());
      p.received.assign(size(), false);
      p.first_seen = std::chrono::steady_clock::now();
      it = pending_.emplace(req.name, std::move(p)).first;
      arrival_order_.push_back(req.name);
    }
    PendingTensor& p = it->second;
    if (timeline_) timeline_->NegotiateRankReady(req.name, global_ranks_[from_rank]);
    if (!p.received[from_rank]) {
      p.received[from_rank] = true;
      ++p.count;
    }
    p.requests[from_rank] = req;
  }
}

std::string Controller::RankList(const std::vector<int>& set_ranks) const {
  std::ostringstream os;
  os << (set_ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < set_ranks.size(); ++i) {
    if (i) os << ", ";
    os << global_ranks_[set_ranks[i]];
  }
  return os.str();
}

namespace {

// "ranks 0, 2: [2]; rank 1: [3]" for the values a field took on each rank.
template <typename F>
std::string ByRank(const std::vector<Request>& reqs, const std::vector<bool>& received,
                   const std::vector<int>& global_ranks, F describe) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < reqs.size(); ++r) {
    if (!received[r]) continue;
    std::string v = describe(reqs[r]);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const std::pair<std::string, std::vector<int>>& g) { return g.first == v; });
    if (it == groups.end()) {
      groups.push_back({v, {global_ranks[r]}});
    } else {
      it->second.push_back(global_ranks[r]);
    }
  }
  std::ostringstream os;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i) os << "; ";
    os << (groups[i].second.size() == 1 ? "rank " : "ranks ");
    for (size_t j = 0; j < groups[i].second.size(); ++j) {
      if (j) os << ", ";
      os << groups[i].second[j];
    }
    os << ": " << groups[i].first;
  }
  return os.str();
}

std::string Num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string IntList(const std::vector<int64_t>& v) { return ShapeString(v); }

Response ErrorResponse(const std::string& name, const std::string& message) {
  Response r;
  r.type = ResponseType::ERROR;
  r.tensor_names = {name};
  r.error_message = message;
  return r;
}

}  // namespace

Response Controller::Validate(const std::string& name, const PendingTensor& p) const {
  const auto& reqs = p.requests;
  int first = 0;
  while (!p.received[first]) ++first;
  const Request& ref = reqs[first];
  const std::string quoted = "'" + name + "'";

  // Returns the first two distinct descriptions, or an empty pair if all agree.
  auto mismatch = [&](auto describe) -> std::pair<std::string, std::string> {
    std::string a = describe(ref);
    for (size_t r = 0; r < reqs.size(); ++r) {
      if (!p.received[r]) continue;
      std::string b = describe(reqs[r]);
      if (b != a) return {a, b};
    }
    return {"", ""};
  };
  auto detail = [&](auto describe) {
    return " (" + ByRank(reqs, p.received, global_ranks_, describe) + ").";
  };

  auto op_of = [](const Request& q) { return std::string(CollectiveName(q.type)); };
  auto mm = mismatch(op_of);
  if (!mm.first.empty()) {
    return ErrorResponse(name, "Mismatched collective operations for tensor " + quoted +
                                   ": One rank requested " + mm.first +
                                   ", but another rank requested " + mm.second + detail(op_of));
  }
  const CollectiveType type = ref.type;
  const char* tname = CollectiveName(type);

  auto dtype_of = [](const Request& q) { return std::string(DataTypeName(q.dtype)); };
  mm = mismatch(dtype_of);
  if (!mm.first.empty() && type != CollectiveType::BARRIER &&
      type != CollectiveType::ADD_PROCESS_SET && type != CollectiveType::REMOVE_PROCESS_SET) {
    return ErrorResponse(name, "Mismatched data types for tensor " + quoted +
                                   ": One rank had type " + mm.first +
                                   ", but another rank had type " + mm.second + detail(dtype_of));
  }

  // Ranks may hold a tensor on different GPUs, but not on the CPU on one rank
  // and a GPU on another: those run on different data planes and executors.
  auto device_kind = [](const Request& q) {
    return std::string(IsGpuDevice(q.device) ? "GPU" : "CPU");
  };
  auto device_of = [](const Request& q) { return DeviceName(q.device); };
  mm = mismatch(device_kind);
  if (!mm.first.empty() && type != CollectiveType::BARRIER &&
      type != CollectiveType::ADD_PROCESS_SET && type != CollectiveType::REMOVE_PROCESS_SET) {
    return ErrorResponse(name, "Mismatched devices for tensor " + quoted + ": One rank had a " +
                                   mm.first + " tensor, but another rank had a " + mm.second +
                                   " tensor; every rank must place it on a GPU, or every rank "
                                   "on the CPU" + detail(device_of));
  }

  auto group_of = [](const Request& q) {
    return q.group_name.empty() ? std::string("not grouped")
                                : "group '" + q.group_name + "' of " + std::to_string(q.group_size);
  };
  mm = mismatch(group_of);
  if (!mm.first.empty()) {
    return ErrorResponse(name, "Mismatched groups for tensor " + quoted +
                                   ": ranks must group the same tensors, but one rank sent " +
                                   mm.first + " and another " + mm.second + detail(group_of));
  }

  auto shape_of = [](const Request& q) { return ShapeString(q.shape); };
  auto trailing_of = [](const Request& q) {
    if (q.shape.empty()) return std::string("[] (a scalar)");
    std::string out = "[?";
    for (size_t i = 1; i < q.shape.size(); ++i) out += ", " + std::to_string(q.shape[i]);
    return out + "]";
  };
  auto op_name = [](const Request& q) { return std::string(ReduceOpName(q.reduce_op)); };
  auto pre_of = [](const Request& q) { return Num(q.prescale_factor); };
  auto post_of = [](const Request& q) { return Num(q.postscale_factor); };
  auto root_of = [](const Request& q) { return std::to_string(q.root_rank); };
  auto splits_of = [](const Request& q) { return IntList(q.splits); };

  auto check_reduction = [&]() -> std::string {
    auto m = mismatch(op_name);
    if (!m.first.empty())
      return std::string("Mismatched ") + tname + " reduce ops for tensor " + quoted +
             ": One rank requested " + m.first + ", but another rank requested " + m.second +
             detail(op_name);
    m = mismatch(pre_of);
    if (!m.first.empty())
      return std::string("Mismatched ") + tname + " prescale factors for tensor " + quoted +
             ": One rank had " + m.first + ", but another rank had " + m.second + detail(pre_of);
    m = mismatch(post_of);
    if (!m.first.empty())
      return std::string("Mismatched ") + tname + " postscale factors for tensor " + quoted +
             ": One rank had " + m.first + ", but another rank had " + m.second + detail(post_of);
    return "";
  };
  auto check_same_shape = [&]() -> std::string {
    auto m = mismatch(shape_of);
    if (!m.first.empty())
      return std::string("Mismatched ") + tname + " tensor shapes for tensor " + quoted +
             ": One rank sent a tensor of shape " + m.first +
             ", but another rank sent a tensor of shape " + m.second + detail(shape_of);
    return "";
  };
  auto check_trailing = [&]() -> std::string {
    for (size_t r = 0; r < reqs.size(); ++r) {
      if (p.received[r] && reqs[r].shape.empty())
        return std::string(tname) + " of tensor " + quoted + " needs at least one dimension, but " +
               RankList({static_cast<int>(r)}) + " sent a scalar.";
    }
    auto m = mismatch(trailing_of);
    if (!m.first.empty())
      return std::string("Mismatched ") + tname + " tensor shapes for tensor " + quoted +
             ": all dimensions but the first must agree, but one rank sent " + m.first +
             " and another " + m.second + detail(shape_of);
    return "";
  };

  Response resp;
  resp.type = ResponseType::COLLECTIVE;
  resp.collective = type;
  resp.tensor_names = {name};
  resp.dtype = ref.dtype;
  resp.reduce_op = ref.reduce_op;
  resp.prescale_factor = ref.prescale_factor;
  resp.postscale_factor = ref.postscale_factor;
  resp.root_rank = ref.root_rank;
  // A rank that has joined never sent this tensor; it takes part with zeros
  // on the same kind of device as the others.
  resp.devices.resize(reqs.size());
  for (size_t r = 0; r < reqs.size(); ++r)
    resp.devices[r] = p.received[r] ? reqs[r].device : ref.device;
  std::string err;

  switch (type) {
    case CollectiveType::ALLREDUCE:
      err = check_reduction();
      if (err.empty()) err = check_same_shape();
      resp.tensor_sizes = {NumElements(ref.shape)};
      break;
    case CollectiveType::REDUCESCATTER:
      err = check_reduction();
      if (err.empty()) err = check_same_shape();
      if (err.empty() && ref.shape.empty())
        err = "REDUCESCATTER of tensor " + quoted + " needs at least one dimension to scatter.";
      resp.tensor_sizes = {NumElements(ref.shape)};
      break;
    case CollectiveType::BROADCAST: {
      auto m = mismatch(root_of);
      if (!m.first.empty()) {
        err = "Mismatched BROADCAST root ranks for tensor " + quoted +
              ": One rank specified root rank " + m.first +
              ", but another rank specified root rank " + m.second + detail(root_of);
      } else {
        // Requests carry root_rank as the user gave it: a job-wide rank, as in
        // Horovod. Here, the one place every path (eager, graph, in-place,
        // gradients) passes through, it becomes the root's rank in the set.
        auto it = std::find(global_ranks_.begin(), global_ranks_.end(), ref.root_rank);
        if (it == global_ranks_.end()) {
          bool whole_range = true;
          for (int i = 0; i < size(); ++i) whole_range = whole_range && global_ranks_[i] == i;
          std::string ranks;
          for (int g : global_ranks_) ranks += (ranks.empty() ? "" : ", ") + std::to_string(g);
          err = "Invalid BROADCAST root rank " + std::to_string(ref.root_rank) + " for tensor " +
                quoted +
                (whole_range ? ": the root must be in [0, " + std::to_string(size()) + ")."
                             : ": root_rank is a job-wide rank and must be one of the process "
                               "set's ranks [" + ranks + "].");
        } else {
          resp.root_rank = static_cast<int32_t>(it - global_ranks_.begin());
          err = check_same_shape();
        }
      }
      break;
    }
    case CollectiveType::ALLGATHER:
      err = check_trailing();
      if (err.empty()) {
        for (size_t r = 0; r < reqs.size(); ++r) resp.tensor_sizes.push_back(reqs[r].shape[0]);
      }
      break;
    case CollectiveType::ALLTOALL:
      err = check_trailing();
      for (size_t r = 0; err.empty() && r < reqs.size(); ++r) {
        const Request& q = reqs[r];
        std::vector<int64_t> splits = q.splits;
        if (splits.empty()) {
          if (q.shape[0] % size() != 0) {
            err = "ALLTOALL of tensor " + quoted + " without splits needs a first dimension " +
                  "divisible by the number of ranks (" + std::to_string(size()) + "), but " +
                  RankList({static_cast<int>(r)}) + " sent shape " + ShapeString(q.shape) + ".";
            break;
          }
          splits.assign(size(), q.shape[0] / size());
        }
        int64_t total = 0;
        bool negative = false;
        for (int64_t s : splits) {
          total += s;
          negative |= s < 0;
        }
        if (static_cast<int>(splits.size()) != size() || negative || total != q.shape[0]) {
          err = "Invalid ALLTOALL splits for tensor " + quoted + " on " +
                RankList({static_cast<int>(r)}) + ": splits " + IntList(q.splits) +
                " must have one non-negative entry per rank (" + std::to_string(size()) +
                ") adding up to the first dimension " + std::to_string(q.shape[0]) + ".";
          break;
        }
        resp.tensor_sizes.insert(resp.tensor_sizes.end(), splits.begin(), splits.end());
      }
      break;
    case CollectiveType::ADD_PROCESS_SET: {
      auto m = mismatch(splits_of);
      if (!m.first.empty()) {
        err = "Mismatched process set definitions: every rank must add the same ranks in the "
              "same order" + detail(splits_of);
        break;
      }
      std::set<int64_t> seen;
      for (int64_t r : ref.splits) {
        if (r < 0 || r >= size() || !seen.insert(r).second) {
          err = "Invalid process set " + IntList(ref.splits) + ": ranks must be distinct and in [0, " +
                std::to_string(size()) + ").";
          break;
        }
      }
      if (err.empty() && ref.splits.empty()) err = "Invalid process set []: it has no ranks.";
      resp.ranks = ref.splits;
      std::sort(resp.ranks.begin(), resp.ranks.end());
      break;
    }
    case CollectiveType::REMOVE_PROCESS_SET: {
      auto m = mismatch(splits_of);
      if (!m.first.empty())
        err = "Mismatched process set removal: ranks asked to remove different sets" +
              detail(splits_of);
      resp.ranks = ref.splits;
      break;
    }
    case CollectiveType::BARRIER:
    case CollectiveType::JOIN:
      break;
  }
  if (!err.empty()) return ErrorResponse(name, err);
  return resp;
}

void Controller::SendParams(int64_t fusion_threshold_bytes, double cycle_time_ms,
                            int64_t shm_min_bytes) {
  params_to_send_.has_params = true;
  params_to_send_.fusion_threshold_bytes = fusion_threshold_bytes;
  params_to_send_.cycle_time_ms = cycle_time_ms;
  params_to_send_.shm_min_bytes = shm_min_bytes;
}

std::string Controller::GroupFailure(const std::string& group) const {
  return "Group '" + group + "' failed as a whole because one of its tensors failed: " +
         failed_groups_.at(group).cause;
}

ResponseList Controller::BuildResponseList() {
  ResponseList out;
  out.shutdown = shutdown_;
  out.shutdown_reason = shutdown_reason_;
  if (params_to_send_.has_params) {
    out.has_params = true;
    out.fusion_threshold_bytes = params_to_send_.fusion_threshold_bytes;
    out.cycle_time_ms = params_to_send_.cycle_time_ms;
    out.shm_min_bytes = params_to_send_.shm_min_bytes;
    params_to_send_.has_params = false;
  }
  std::vector<Response> ready;
  std::vector<std::string> still_pending;
  // A failed group's marker lasts a moment: its members are submitted
  // together, and a later step may reuse the group name legitimately.
  const auto now = std::chrono::steady_clock::now();
  for (auto it = failed_groups_.begin(); it != failed_groups_.end();) {
    it = now - it->second.when > std::chrono::seconds(1) ? failed_groups_.erase(it) : std::next(it);
  }
  for (const std::string& name : arrival_order_) {
    PendingTensor& p = pending_.at(name);
    const Request& any = p.requests[std::find(p.received.begin(), p.received.end(), true) -
                                    p.received.begin()];
    if (!any.group_name.empty() && failed_groups_.count(any.group_name)) {
      ready.push_back(ErrorResponse(name, GroupFailure(any.group_name)));
      pending_.erase(name);
      continue;
    }
    int missing_unjoined = 0;
    for (int r = 0; r < size(); ++r) missing_unjoined += (!p.received[r] && !joined_[r]);
    if (missing_unjoined > 0 || p.count == 0) {
      still_pending.push_back(name);
      continue;
    }
    Response resp;
    const CollectiveType type = p.requests[std::find(p.received.begin(), p.received.end(), true) -
                                           p.received.begin()]
                                    .type;
    if (p.count < size() && type != CollectiveType::ALLREDUCE) {
      std::vector<int> joined_ranks;
      for (int r = 0; r < size(); ++r)
        if (joined_[r]) joined_ranks.push_back(r);
      resp = ErrorResponse(name, std::string(CollectiveName(type)) + " of tensor '" + name +
                                     "' cannot run while " + RankList(joined_ranks) +
                                     (joined_ranks.size() == 1 ? " has" : " have") +
                                     " called join(); only allreduce can.");
    } else {
      resp = Validate(name, p);
    }
    int first = std::find(p.received.begin(), p.received.end(), true) - p.received.begin();
    const Request& ref = p.requests[first];
    if (resp.type == ResponseType::COLLECTIVE && type == CollectiveType::ADD_PROCESS_SET) {
      resp.int_result = next_process_set_id_++;
    }
    if (!ref.group_name.empty() && ref.group_size > 1) {
      auto& group = ready_groups_[ref.group_name];
      if (resp.type == ResponseType::ERROR && !failed_groups_.count(ref.group_name)) {
        failed_groups_[ref.group_name] = {now, resp.error_message};
      }
      group.push_back(std::move(resp));
      if (failed_groups_.count(ref.group_name)) {
        // One member failed: the group cannot run as one, so every member
        // fails, including those that come later (below).
        for (auto& g : group) {
          if (g.type != ResponseType::ERROR) {
            g = ErrorResponse(g.tensor_names[0], GroupFailure(ref.group_name));
          }
          ready.push_back(std::move(g));
        }
        ready_groups_.erase(ref.group_name);
      } else if (static_cast<int>(group.size()) == ref.group_size) {
        for (auto& g : group) ready.push_back(std::move(g));
        ready_groups_.erase(ref.group_name);
      }
    } else {
      ready.push_back(std::move(resp));
    }
    pending_.erase(name);
  }
  arrival_order_.swap(still_pending);

  out.responses = Fuse(std::move(ready), fusion_threshold_);
  if (num_joined_ == size()) {
    Response join;
    join.collective = CollectiveType::JOIN;
    join.int_result = last_joined_;
    join.tensor_names = {};
    out.responses.push_back(join);
    joined_.assign(size(), false);
    num_joined_ = 0;
    last_joined_ = -1;
  }
  return out;
}

std::vector<Response> Controller::Fuse(std::vector<Response> responses, int64_t threshold) {
  std::vector<Response> out;
  std::vector<bool> used(responses.size(), false);
  auto fusable = [](const Response& r) {
    return r.type == ResponseType::COLLECTIVE && r.collective == CollectiveType::ALLREDUCE;
  };
  auto bytes = [](const Response& r) {
    int64_t n = 0;
    for (int64_t s : r.tensor_sizes) n += s;
    return n * DataTypeSize(r.dtype);
  };
  for (size_t i = 0; i < responses.size(); ++i) {
    if (used[i]) continue;
    used[i] = true;
    Response cur = std::move(responses[i]);
    if (fusable(cur)) {
      int64_t total = bytes(cur);
      // Look ahead past other kinds of responses: every rank fuses the same
      // way because every rank sees the same list.
      for (size_t j = i + 1; j < responses.size() && total < threshold; ++j) {
        const Response& nxt = responses[j];
        if (used[j] || !fusable(nxt) || nxt.dtype != cur.dtype || nxt.reduce_op != cur.reduce_op ||
            nxt.prescale_factor != cur.prescale_factor ||
            nxt.postscale_factor != cur.postscale_factor || nxt.devices != cur.devices) {
          continue;
        }
        int64_t b = bytes(nxt);
        if (total + b > threshold) continue;
        total += b;
        used[j] = true;
        cur.tensor_names.push_back(nxt.tensor_names[0]);
        cur.tensor_sizes.push_back(nxt.tensor_sizes[0]);
      }
    }
    out.push_back(std::move(cur));
  }
  return out;
}

std::vector<std::pair<Controller::Stall, std::vector<int>>> Controller::StalledTensors(
    double seconds) const {
  std::vector<std::pair<Stall, std::vector<int>>> out;
  auto now = std::chrono::steady_clock::now();
  for (const std::string& name : arrival_order_) {
    const PendingTensor& p = pending_.at(name);
    const double waited = std::chrono::duration<double>(now - p.first_seen).count();
    if (waited < seconds) continue;
    std::vector<int> missing;
    for (int r = 0; r < size(); ++r)
      if (!p.received[r] && !joined_[r]) missing.push_back(global_ranks_[r]);
    out.push_back({{name, waited}, missing});
  }
  return out;
}

}  // namespace tfring
