// Speculation: skipping negotiation in the steady state.
//
// Every rank feeds the detector the same thing, the response list each
// round agreed on, so every rank enters speculative mode at the same round
// without a message: after `kRounds` consecutive "rounds" (a round ends when
// a tensor comes round again: one training step) with the same tensors, all
// cache hits, no coordinator traffic and no rank vetoing (join pending,
// several process sets, speculation switched off, ...). The last round,
// with its order and fusion, becomes the schedule.
//
// In speculative mode the controller sends nothing: Cycle() returns the
// schedule's next responses once this rank holds all of their tensors,
// marked `speculative`. Before anything is written, every rank learns
// whether all ranks followed the schedule from the reduced divergence flag
// (FlagRidesAlong says how it travels; speculation_run.h runs it). A rank
// that cannot follow the schedule (a tensor not in it, another shape, join,
// shutdown, autotuned values to send, or nothing for its patience) runs the
// next response with `diverged` set: it raises the flag and sends nothing
// else. If the reduced flag is not zero no rank writes an output, every rank
// reports Result(FLAGGED), and the tensors held go back through normal
// negotiation, on every rank alike.
//
// The Controller owns one Speculation per process set and is its only
// caller; the background loop reaches it through the controller.
#ifndef TFRING_COMMON_SPECULATION_H
#define TFRING_COMMON_SPECULATION_H

#include <chrono>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "executor.h"
#include "message.h"
#include "response_cache.h"
#include "speculation_stats.h"
#include "status.h"

namespace tfring {

// How a speculative response ended (Speculation::Result).
enum class SpeculationOutcome {
  AGREED,   // no rank raised the divergence flag; the collective ran
  FLAGGED,  // some rank raised it; nothing was written anywhere
  FAILED,   // the data plane failed; the response's tensors got its error
};

class Speculation {
 public:
  static constexpr int kRounds = 3;
  // Each fallback doubles the rounds needed to enter again, up to this (a
  // job alternating between two kinds of steps then tries rarely); a whole
  // schedule run without one brings them back to kRounds.
  static constexpr int kMaxRounds = 16;
  // A single tensor larger than this sends the flag on its own: two copies
  // of 64 KB cost about as much as a one-element round within a host.
  static constexpr int64_t kFlagRidesMaxBytes = 64 << 10;

  // Whether `r` may be run speculatively: allreduce, broadcast or allgather,
  // of host or device tensors.
  static bool Eligible(const Response& r);
  // How an eligible response carries the flag. True: as one extra element
  // of the fusion buffer, reduced with the data in one data-plane call
  // (float sums and averages of host tensors, fused or small). False: in a one-element
  // allreduce of its own, after which the collective runs as a negotiated
  // one would, straight from the inputs into the outputs. The first saves a
  // plane round; the second saves staging each tensor through the fusion
  // buffer and back, which the normal path does only for fused responses.
  static bool FlagRidesAlong(const Response& r);

  // `patience`: how long a speculating rank waits for the schedule's next
  // tensors before it leaves (raises the flag), so that the stall inspector
  // gets to see what is missing.
  explicit Speculation(std::chrono::steady_clock::duration patience) : patience_(patience) {}

  // This rank's own veto (TFRING_SPECULATION=0, process sets other than the
  // global one): the round's AND makes it every rank's.
  void set_allowed(bool allowed) { allowed_ = allowed; }
  bool allowed() const { return allowed_; }
  bool active() const { return active_; }
  // True while requests wait here: held for the schedule, or to be
  // negotiated again after a fallback.
  bool holds_requests() const { return !held_.empty() || !replay_.empty(); }
  bool has_replay() const { return !replay_.empty(); }
  // The requests to negotiate before this cycle's new ones (after a
  // fallback); leaves none behind.
  std::vector<Request> TakeReplay();

  // A normal round: feeds the detector the list every rank agreed on.
  // `clean`: every rank agreed that the round needed no coordinator and may
  // count towards speculation. Returns true when speculative mode starts:
  // the caller then hands over, with Hold, the hits it holds that other
  // ranks have not matched yet (the schedule takes them, or this rank
  // diverges if they are not in it).
  bool Observe(const ResponseList& agreed, bool clean);
  void Hold(std::vector<Request> requests);

  // A speculative cycle: `mine` are this rank's new requests (taken: left
  // empty); `leave` says this rank must leave the schedule (shutdown, tuned
  // values to send).
  // `cache` holds each tensor's request as it was negotiated (it does not
  // change while speculating). Writes the responses to run into `out`.
  void Cycle(std::vector<Request>* mine, bool leave, const ResponseCache& cache,
             ResponseList* out);
  // Called once per speculative response run, in order. The responses after
  // one that did not agree, in the same list, must not run. FLAGGED sends
  // the response's tensors and everything held back through negotiation.
  // FAILED does the same for all but the response's own tensors, which are
  // done (with the plane's error): speculation never talks to the
  // controller's transport, so only a negotiation can find out that a peer
  // is gone and stop the job as broken (elastic mode depends on that).
  void Result(SpeculationOutcome outcome);
  const SpeculationStats& stats() const { return stats_; }

 private:
  void CloseRound();
  void ResetDetector();
  void Enter(size_t position);

  std::chrono::steady_clock::duration patience_;
  bool allowed_ = true;
  bool active_ = false;
  // Detector: the current round's responses and names, the last round's
  // responses and sorted names, and how many rounds in a row had them.
  std::vector<Response> round_;
  std::unordered_set<std::string> round_names_;
  std::vector<Response> last_round_;
  std::vector<std::string> last_round_sorted_;
  int repeats_ = 0;
  // Rounds needed to (re-)enter; doubles after each fallback (agreed on by
  // every rank), so a job whose steps really differ stops trying soon.
  int required_rounds_ = kRounds;
  // Speculative mode: the schedule, the position of the next response, and
  // which response each tensor belongs to.
  std::vector<Response> schedule_;
  size_t position_ = 0;
  size_t agreed_since_entry_ = 0;
  std::unordered_map<std::string, size_t> schedule_index_;
  // This rank's requests not yet run: held until their response is due.
  std::unordered_map<std::string, Request> held_;
  // Requests of responses handed out and not yet reported on, in order:
  // running_[running_head_] is the oldest. A vector with a moving head, not
  // a std::deque, which allocated a block every ~20 responses.
  std::vector<std::vector<Request>> running_;
  size_t running_head_ = 0;
  bool running_empty() const { return running_head_ == running_.size(); }
  void ClearRunning() {
    running_.clear();
    running_head_ = 0;
  }
  // Requests to negotiate after a fallback (before the round's new ones).
  std::vector<Request> replay_;
  std::vector<Request> incoming_;  // Cycle's scratch, kept for its capacity
  // Storage of finished requests and responses, reused by the next ones
  // (Cycle): held_'s nodes, running_'s vectors, the responses of a cycle
  // that handed out fewer than the last. At most kSpares of each.
  static constexpr size_t kSpares = 256;
  std::vector<std::unordered_map<std::string, Request>::node_type> spare_held_;
  std::vector<std::vector<Request>> spare_running_;
  std::vector<Response> spare_responses_;
  // Pops running_'s front, keeping its vector in spare_running_ and its
  // requests' storage in SpareRequests().
  void RecycleFront();
  std::chrono::steady_clock::time_point waiting_since_;
  SpeculationStats stats_;
};

// A speculative allreduce: like RunAllreduce (executor.h), but through the
// fusion buffer with one more element, the divergence flag, 1 from a rank
// that `diverged` (it contributes zeros for every slot) and 0 otherwise.
// Outputs are written only when the reduced flag is 0 (*agreed = true);
// otherwise nothing is written and the caller negotiates the tensors again.
// Host memory only (float32/float64): the flag is read back at once.
Status RunSpeculativeAllreduce(Executor& executor, DataPlane& plane,
                               const std::vector<ReduceSlot>& slots, DataType dtype, ReduceOp op,
                               double prescale, double postscale, int ranks, bool diverged,
                               bool* agreed, const PhaseFn& phase);

}  // namespace tfring

#endif  // TFRING_COMMON_SPECULATION_H
