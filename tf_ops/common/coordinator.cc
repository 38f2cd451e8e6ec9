// The coordinator's side of negotiation (set rank 0): it collects every
// rank's requests, releases the tensors ready on every rank (checked by
// validation.cc), groups and fuses them, and watches for stalls.
#include "controller.h"

#include <algorithm>
#include <chrono>

namespace tfring {

void Controller::Ingest(const RequestList& list, int from_rank) {
  if (list.shutdown && !shutdown_) {
    shutdown_ = true;
    shutdown_reason_ = list.shutdown_reason;
    shutdown_cause_ = list.shutdown_cause;
    shutdown_rank_ = list.shutdown_rank;
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
  out.shutdown_cause = shutdown_cause_;
  out.shutdown_rank = shutdown_rank_;
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
    int abandoned_by = -1;
    for (int r = 0; r < size() && abandoned_by < 0; ++r) {
      if (p.received[r] && !p.requests[r].abandoned.empty()) abandoned_by = r;
    }
    if (abandoned_by >= 0) {
      resp = ErrorResponse(name, std::string(CollectiveName(type)) + " of tensor '" + name +
                                     "' failed because rank " +
                                     std::to_string(global_ranks_[abandoned_by]) +
                                     " raised before submitting it: " +
                                     p.requests[abandoned_by].abandoned);
    } else if (p.count < size() && type != CollectiveType::ALLREDUCE) {
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
