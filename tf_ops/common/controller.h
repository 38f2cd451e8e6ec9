// Negotiation. Every cycle each rank of a process set sends the coordinator
// (set rank 0) the tensors it has become ready to reduce; the coordinator
// decides which tensors are ready on every rank, checks that the ranks agree
// on them, fuses small allreduces, and sends every rank the same ordered
// ResponseList. That single order is what keeps ranks from deadlocking when
// their framework schedulers submit collectives in different orders.
//
// One class, three files: the rounds every rank runs (controller.cc), the
// coordinator's side (coordinator.cc) and its checks of each tensor
// (validation.cc). Speculation, which skips the rounds in the steady state,
// is a component of its own (speculation.h). How the bytes travel (MPI, or
// point-to-point messages over TCP) is left to subclasses.
#ifndef TFRING_COMMON_CONTROLLER_H
#define TFRING_COMMON_CONTROLLER_H

#include <chrono>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "config.h"
#include "message.h"
#include "response_cache.h"
#include "speculation.h"
#include "status.h"
#include "timeline.h"

namespace tfring {

class Controller {
 public:
  // `global_ranks[i]` is the job-wide rank of set rank i (used in messages).
  Controller(int rank, std::vector<int> global_ranks, const Config& config);
  virtual ~Controller() = default;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  bool is_coordinator() const { return rank_ == 0; }

  // One negotiation round. Every rank of the set must call it; it returns the
  // same list on every rank. Tensors that hit the response cache are agreed
  // on by one bitwise-AND allreduce; only the rest (and shutdown, join,
  // process-set changes) go through the coordinator.
  Status ComputeResponseList(const RequestList& mine, ResponseList* out);
  // The same, taking `mine`'s requests (left empty or moved from): while
  // speculating they are held as they are, with no copy per collective.
  Status ComputeResponseList(RequestList&& mine, ResponseList* out);
  // True while this rank holds cache hits that other ranks have not matched.
  bool HasPendingHits() const {
    return !pending_hits_.empty() || !deferred_.empty() || speculation_.holds_requests();
  }

  // --- Speculation (speculation.h): the loop's view of this set's.
  // This rank's own veto (TFRING_SPECULATION=0, process sets other than the
  // global one): the round's AND makes it every rank's.
  void set_speculation_allowed(bool allowed) { speculation_.set_allowed(allowed); }
  bool speculating() const { return speculation_.active(); }
  // Called once per speculative response run, in order (Speculation::Result).
  void SpeculationResult(SpeculationOutcome outcome) { speculation_.Result(outcome); }
  const SpeculationStats& speculation_stats() const { return speculation_.stats(); }

  // --- Coordinator logic, public so it can be tested without a transport.
  void Ingest(const RequestList& list, int from_rank);
  ResponseList BuildResponseList();
  // Merges compatible allreduces (same dtype, op, scale factors and, on
  // every rank, the same device: one fusion buffer lives on one device) whose
  // combined size stays within `threshold_bytes`. Order among the remaining
  // responses is kept.
  static std::vector<Response> Fuse(std::vector<Response> responses, int64_t threshold_bytes);
  // Tensors some ranks have been waiting on for longer than `seconds`, with
  // how long and the (job-wide) ranks that have not submitted them.
  struct Stall {
    std::string name;
    double seconds;
  };
  std::vector<std::pair<Stall, std::vector<int>>> StalledTensors(double seconds) const;
  // Ids handed out for new process sets (the global set's coordinator only).
  void set_next_process_set_id(int32_t id) { next_process_set_id_ = id; }
  // Coordinator: send these autotuned values to every rank in the next cycle.
  void SendParams(int64_t fusion_threshold_bytes, double cycle_time_ms, int64_t shm_min_bytes);
  int64_t fusion_threshold() const { return fusion_threshold_; }
  void set_fusion_threshold(int64_t bytes) { fusion_threshold_ = bytes; }
  // Where the coordinator records which rank became ready when (may be null).
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

 protected:
  // Coordinator receives every rank's bytes in `all` (index = set rank).
  virtual Status GatherRequests(const std::string& mine, std::vector<std::string>* all) = 0;
  // The coordinator's `bytes` reach every rank.
  virtual Status BroadcastResponses(std::string* bytes) = 0;
  // Bitwise AND of `words` across the set's ranks, in place.
  virtual Status AllreduceBitsAnd(std::vector<uint64_t>* words) = 0;

 private:
  // The coordinator path: gather requests, decide, broadcast.
  Status NegotiateWithCoordinator(const RequestList& mine, ResponseList* out);
  // Records negotiated responses in the cache and settles this rank's hits.
  void UpdateCache(const ResponseList& negotiated);
  // Speculation (speculation.h): its cycle, this rank's veto, and the
  // detector fed with every round's agreed list.
  Status SpeculativeCycle(RequestList* mine, ResponseList* out);
  bool LocallyReadyToSpeculate() const;
  // `clean`: every rank agreed that the round needed no coordinator and may
  // count towards speculation.
  void FeedDetector(const ResponseList& agreed, bool clean);
  // `requests` minus the members of groups not yet complete on this rank,
  // plus the members of groups completed by them.
  std::vector<Request> StageGroups(const std::vector<Request>& requests);
  struct PendingTensor {
    std::vector<Request> requests;  // index = set rank; valid where `received`
    std::vector<bool> received;
    int count = 0;
    std::chrono::steady_clock::time_point first_seen;
  };

  // validation.cc: the coordinator's checks of one tensor's requests.
  Response Validate(const std::string& name, const PendingTensor& pending) const;
  // Fails `name` on every rank; `cause` says whether ranks disagreed
  // (MISMATCH) or agreed on something that cannot run (INVALID_ARGUMENT).
  static Response ErrorResponse(const std::string& name, const std::string& message,
                                FailureCause cause = FailureCause::MISMATCH);
  std::string RankList(const std::vector<int>& set_ranks) const;
  std::string GroupFailure(const std::string& group) const;

  int rank_;
  std::vector<int> global_ranks_;
  Timeline* timeline_ = nullptr;
  int64_t fusion_threshold_;

  std::unordered_map<std::string, PendingTensor> pending_;
  std::vector<std::string> arrival_order_;
  std::unordered_map<std::string, std::vector<Response>> ready_groups_;
  // Groups with a failed member: when, and the member's error (for the others).
  struct FailedGroup {
    std::chrono::steady_clock::time_point when;
    std::string cause;
  };
  std::unordered_map<std::string, FailedGroup> failed_groups_;
  std::vector<bool> joined_;
  int num_joined_ = 0;
  int32_t last_joined_ = -1;
  bool shutdown_ = false;
  std::string shutdown_reason_;
  int32_t shutdown_cause_ = 0;
  int32_t shutdown_rank_ = -1;
  int32_t next_process_set_id_ = 1;
  ResponseList params_to_send_;  // only its has_params and value fields are used

  // --- Every rank: the response cache and this rank's side of it.
  struct Hit {
    Request request;
    std::chrono::steady_clock::time_point since;
  };
  ResponseCache cache_;
  std::map<int, Hit> pending_hits_;                       // bit -> my request
  std::vector<Request> deferred_;                         // to negotiate next cycle
  std::unordered_map<std::string, Request> negotiating_;  // sent to the coordinator
  // Members of groups of which only some have been submitted (by group name).
  std::unordered_map<std::string, std::vector<Request>> arriving_groups_;
  bool join_pending_ = false;
  // Hits not matched by every rank within this long go to the coordinator,
  // whose stall inspector can then say which ranks are missing. In
  // speculative mode, a rank that has waited this long for the next
  // response's tensors leaves it (raises the flag), for the same reason.
  std::chrono::steady_clock::duration hit_patience_;

  Speculation speculation_;
};

}  // namespace tfring

#endif  // TFRING_COMMON_CONTROLLER_H
