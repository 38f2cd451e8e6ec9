#include "speculation_run.h"

#include <string>
#include <vector>

#include "execution.h"

namespace tfring {

namespace {

// A speculated allreduce whose divergence flag rides in the fusion buffer
// (Speculation::FlagRidesAlong); PerformSpeculative's contract.
SpeculationOutcome PerformSpeculativeAllreduce(ProcessSet& ps, const Response& r) {
  const size_t n = r.tensor_names.size();
  std::vector<ReduceSlot>& slots = ps.round.slots;  // the set's, reused
  slots.assign(n, ReduceSlot());
  for (size_t i = 0; i < n; ++i) {
    slots[i].count = r.tensor_sizes[i];
    // A rank that diverged may lack some of them: it sends zeros anyway.
    if (!r.diverged) ps.queue.Peek(r.tensor_names[i], &slots[i].input, &slots[i].output);
  }
  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  bool agreed = false;
  Status s = Route(ps, CollectiveType::ALLREDUCE, kCpuDevice, TotalBytes(r), &plane, &executor);
  if (s.ok()) {
    s = RunSpeculativeAllreduce(*executor, *plane, slots, r.dtype, r.reduce_op, r.prescale_factor,
                                r.postscale_factor, ps.size(), r.diverged, &agreed, PhasesOf(r));
  }
  if (s.ok() && !agreed) return SpeculationOutcome::FLAGGED;
  // Agreed, or the plane failed: then, as on the normal path, the tensors
  // get its error.
  CompleteQueued(ps, r.tensor_names, s);
  return s.ok() ? SpeculationOutcome::AGREED : SpeculationOutcome::FAILED;
}

// Reduces the divergence flag on its own (a one-element allreduce on the
// plane a tiny host allreduce takes): `agreed` is true when no rank raised it.
Status AgreeOnSchedule(ProcessSet& ps, const Response& r, bool* agreed) {
  DataPlane* plane = nullptr;
  Executor* executor = nullptr;
  TFRING_RETURN_IF_ERROR(
      Route(ps, CollectiveType::ALLREDUCE, kCpuDevice, sizeof(float), &plane, &executor));
  float flag = r.diverged ? 1.0f : 0.0f;
  const auto start = Clock::now();
  Status s = plane->Allreduce(&flag, &flag, 1, DataType::FLOAT32, ReduceOp::SUM);
  Phase(r.tensor_names, "SPECULATION_FLAG", start);
  if (s.in_progress()) return Status::Unknown("tfring: a speculation flag was queued");
  TFRING_RETURN_IF_ERROR(s);
  *agreed = flag == 0.0f;
  return Status::OK();
}

}  // namespace

SpeculationOutcome PerformSpeculative(ProcessSet& ps, const Response& r,
                                      Clock::duration* waited) {
  const auto start = Clock::now();
  if (Speculation::FlagRidesAlong(r)) {
    const SpeculationOutcome outcome = PerformSpeculativeAllreduce(ps, r);
    *waited += Clock::now() - start;
    return outcome;
  }
  bool agreed = false;
  const Status s = AgreeOnSchedule(ps, r, &agreed);
  *waited += Clock::now() - start;
  if (s.ok() && !agreed) return SpeculationOutcome::FLAGGED;
  if (s.ok()) {
    // Every rank agreed: the collective is the negotiated one it was cached
    // as. (Should its plane fail, the next flag fails on it too.)
    PerformOperation(ps, r);
    return SpeculationOutcome::AGREED;
  }
  // As on the normal path the tensors get the plane's error.
  CompleteQueued(ps, r.tensor_names, s);
  return SpeculationOutcome::FAILED;
}

}  // namespace tfring
