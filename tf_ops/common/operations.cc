// Submission (Enqueue and the blocking process-set calls) and the runtime
// queries of operations.h; init and shutdown are in lifecycle.cc.
#include "operations.h"

#include <future>
#include <memory>
#include <mutex>

#include "background_loop.h"
#include "global_state.h"

namespace tfring {

const char* const kJoinTensorName = "__tfring_join__";

namespace {

// An alltoall's rows and splits are this rank's own arguments: checking them
// here fails the call at once with InvalidArgument (as Horovod does), before
// anything is sent, instead of a FailedPrecondition for every rank after
// negotiation. `set_size` is the number of ranks in the process set.
Status CheckAlltoallArguments(const TensorTableEntry& e, int set_size, int rank) {
  if (e.shape.empty()) {
    return Status::InvalidArgument("tfring: alltoall needs a tensor with at least one dimension");
  }
  const std::string quoted = "'" + e.name + "'";
  const int64_t rows = e.shape[0];
  if (e.splits.empty()) {
    if (rows % set_size != 0) {
      return Status::InvalidArgument(
          "ALLTOALL of tensor " + quoted + " without splits needs a first dimension divisible "
          "by the number of ranks (" + std::to_string(set_size) + "), but rank " +
          std::to_string(rank) + " sent shape " + ShapeString(e.shape) + ".");
    }
    return Status::OK();
  }
  int64_t total = 0;
  bool negative = false;
  for (int64_t s : e.splits) {
    total += s;
    negative |= s < 0;
  }
  if (static_cast<int>(e.splits.size()) != set_size || negative || total != rows) {
    return Status::InvalidArgument(
        "Invalid ALLTOALL splits for tensor " + quoted + " on rank " + std::to_string(rank) +
        ": splits " + ShapeString(e.splits) + " must have one non-negative entry per rank (" +
        std::to_string(set_size) + ") adding up to the first dimension " +
        std::to_string(rows) + ".");
  }
  return Status::OK();
}

}  // namespace

Status Enqueue(int32_t process_set_id, TensorTableEntry entry) {
  GlobalState& st = state();
  std::unique_lock<std::mutex> lock(st.gate.mu);
  if (!st.gate.ever_initialized) {
    return Status::NotInitialized("tfring has not been initialized; use hvd.init().");
  }
  if (st.gate.stopped) return st.gate.stopped_status;
  auto ps = st.process_sets.Get(process_set_id);
  if (!ps) {
    return Status::InvalidArgument("tfring: there is no process set with id " +
                                   std::to_string(process_set_id) +
                                   " (was it added with add_process_set() on every rank?)");
  }
  if (!ps->included()) {
    std::string ranks;
    for (int r : ps->ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    return Status::InvalidArgument("tfring: rank " + std::to_string(st.topo.rank) +
                                   " is not a member of process set " +
                                   std::to_string(process_set_id) + " (ranks [" + ranks + "])");
  }
  if (entry.type == CollectiveType::ALLTOALL) {
    Status bad = CheckAlltoallArguments(entry, static_cast<int>(ps->ranks.size()), st.topo.rank);
    if (!bad.ok()) {
      lock.unlock();
      Abandon(process_set_id, entry, bad);
      return bad;
    }
  }
  if (st.timeline.enabled()) st.timeline.NegotiateStart(entry.name, CollectiveName(entry.type));
  // What speculation can run (Speculation::Eligible), with its input ready
  // now or waited for by the device: then, once the order is agreed, this
  // thread launches it (DriveInline), a device collective included: its
  // ready-event wait, the collective on the plane's stream and its fence.
  const bool may_inline = (entry.type == CollectiveType::ALLREDUCE ||
                           entry.type == CollectiveType::BROADCAST ||
                           entry.type == CollectiveType::ALLGATHER) &&
                          (!entry.ready_event || entry.ready_event->waits_on_device());
  TFRING_RETURN_IF_ERROR(ps->queue.Add(std::move(entry), ps->rank));
  lock.unlock();
  if (!(may_inline && DriveInline(*ps))) WakeBackground();
  return Status::OK();
}

void Abandon(int32_t process_set_id, const TensorTableEntry& entry, const Status& why) {
  GlobalState& st = state();
  {
    std::lock_guard<std::mutex> lock(st.gate.mu);
    if (!st.gate.ever_initialized || st.gate.stopped) return;
    auto ps = st.process_sets.Get(process_set_id);
    if (!ps || !ps->included()) return;
    Request r = entry.ToRequest(ps->rank);
    r.abandoned = why.message().empty() ? "an error" : why.message();
    if (!ps->queue.Abandon(std::move(r))) return;
  }
  WakeBackground();
}

namespace {

Status RunBlocking(TensorTableEntry entry, int32_t* result) {
  auto promise = std::make_shared<std::promise<std::pair<Status, int32_t>>>();
  auto future = promise->get_future();
  entry.callback = [promise](const Status& s, int32_t r) { promise->set_value({s, r}); };
  TFRING_RETURN_IF_ERROR(Enqueue(kGlobalProcessSetId, std::move(entry)));
  auto out = future.get();
  if (result) *result = out.second;
  return out.first;
}

}  // namespace

Status AddProcessSet(const std::vector<int>& ranks, int32_t* id) {
  TensorTableEntry e;
  e.name = "__tfring_add_process_set_" + std::to_string(state().add_counter++);
  e.type = CollectiveType::ADD_PROCESS_SET;
  e.dtype = DataType::UINT8;
  e.splits.assign(ranks.begin(), ranks.end());
  return RunBlocking(std::move(e), id);
}

Status RemoveProcessSet(int32_t id) {
  TensorTableEntry e;
  e.name = "__tfring_remove_process_set_" + std::to_string(state().add_counter++);
  e.type = CollectiveType::REMOVE_PROCESS_SET;
  e.dtype = DataType::UINT8;
  e.splits = {id};
  return RunBlocking(std::move(e), nullptr);
}

Status GetProcessSet(int32_t id, int* rank, std::vector<int>* ranks) {
  TFRING_RETURN_IF_ERROR(CheckInitialized());
  auto ps = state().process_sets.Get(id);
  if (!ps) {
    return Status::InvalidArgument("tfring: there is no process set with id " + std::to_string(id));
  }
  *rank = ps->rank;
  *ranks = ps->ranks;
  return Status::OK();
}

std::vector<int32_t> ProcessSetIds() {
  std::vector<int32_t> ids;
  for (const auto& ps : state().process_sets.All()) ids.push_back(ps->id);
  return ids;
}

RuntimeParams GetRuntimeParams() {
  GlobalState& st = state();
  RuntimeParams p;
  p.fusion_threshold_bytes = st.fusion_threshold_bytes;
  p.cycle_time_ms = st.cycle_time_ms;
  p.shm_min_bytes = st.shm_min_bytes;
  p.autotune_done = st.tuner ? st.tuner->done() && !st.tuner->HasUpdate() : false;
  {
    std::lock_guard<std::mutex> lock(st.speculation.mu);
    p.speculation = st.speculation.stats;
  }
  p.inline_responses = st.speculation.inline_responses;
  return p;
}

int64_t QueuedCollectives() {
  int64_t n = 0;
  for (const auto& ps : state().process_sets.All()) n += static_cast<int64_t>(ps->queue.size());
  return n;
}

Status StartTimeline(const std::string& path, bool mark_cycles) {
  TFRING_RETURN_IF_ERROR(CheckInitialized());
  if (Rank() != 0) return Status::OK();  // rank 0 writes the timeline
  return state().timeline.Start(path, mark_cycles);
}

void StopTimeline() { state().timeline.Stop(); }

}  // namespace tfring
