// The coordinator's checks that every rank asked for the same collective
// on a tensor (operation, data type, device kind, group, shape, reduce op,
// scale factors, root, splits, process-set definitions), and the error
// that names what differs and on which ranks.
#include "controller.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace tfring {

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

}  // namespace

Response Controller::ErrorResponse(const std::string& name, const std::string& message,
                                   FailureCause cause) {
  Response r;
  r.type = ResponseType::ERROR;
  r.tensor_names = {name};
  r.error_message = message;
  r.error_cause = cause;
  return r;
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
  // Set by a check that finds a bad request rather than ranks that differ.
  bool invalid = false;
  auto check_trailing = [&]() -> std::string {
    for (size_t r = 0; r < reqs.size(); ++r) {
      if (p.received[r] && reqs[r].shape.empty() && (invalid = true))
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
  // A caller with static shapes (XLA) sized its output for equal row counts.
  auto check_same_rows = [&]() -> std::string {
    bool fixed = false;
    for (size_t r = 0; r < reqs.size(); ++r) fixed |= p.received[r] && reqs[r].same_rows;
    if (!fixed) return "";
    auto rows_of = [](const Request& q) { return std::to_string(q.shape.empty() ? 0 : q.shape[0]); };
    auto m = mismatch(rows_of);
    if (m.first.empty()) return "";
    return std::string("Mismatched ") + tname + " first dimensions for tensor " + quoted +
           ": inside an XLA-compiled step the output's shape is fixed at compile time, so every "
           "rank must send the same number of rows, but one rank sent " + m.first +
           " and another " + m.second + detail(rows_of);
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
      if (err.empty() && ref.shape.empty() && (invalid = true))
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
          invalid = true;
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
      if (err.empty()) err = check_same_rows();
      if (err.empty()) {
        for (size_t r = 0; r < reqs.size(); ++r) resp.tensor_sizes.push_back(reqs[r].shape[0]);
      }
      break;
    case CollectiveType::ALLTOALL:
      err = check_trailing();
      if (err.empty()) err = check_same_rows();
      for (size_t r = 0; err.empty() && r < reqs.size(); ++r) {
        const Request& q = reqs[r];
        std::vector<int64_t> splits = q.splits;
        if (splits.empty()) {
          if (q.shape[0] % size() != 0) {
            invalid = true;
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
          invalid = true;
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
          invalid = true;
          err = "Invalid process set " + IntList(ref.splits) + ": ranks must be distinct and in [0, " +
                std::to_string(size()) + ").";
          break;
        }
      }
      if (err.empty() && ref.splits.empty() && (invalid = true))
        err = "Invalid process set []: it has no ranks.";
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
  if (!err.empty())
    return ErrorResponse(name, err,
                         invalid ? FailureCause::INVALID_ARGUMENT : FailureCause::MISMATCH);
  return resp;
}

}  // namespace tfring
