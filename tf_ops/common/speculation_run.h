// Running a response the controller scheduled without negotiation
// (speculation.h) on a process set: the divergence flag either rides in the
// fusion buffer (Speculation::FlagRidesAlong) or goes round on its own
// first, and only an agreed response writes its outputs. Internal to
// tf_ops/common: the background loop calls it for every speculative
// response and reports the outcome back to the set's controller.
#ifndef TFRING_COMMON_SPECULATION_RUN_H
#define TFRING_COMMON_SPECULATION_RUN_H

#include <chrono>

#include "message.h"
#include "process_set.h"
#include "speculation.h"

namespace tfring {

// Runs a response the controller scheduled without negotiation. Returns
// FLAGGED, having written and completed nothing, when some rank raised the
// divergence flag: the tensors stay queued and are negotiated again. Every
// rank gets the same answer from the same reduced flag. FAILED: the plane
// failed before the flag was known, and the tensors got its error. Adds to
// `waited` the time until the flag was known, which stands for the
// negotiation round that speculation skipped (when the flag rides along,
// the whole run).
SpeculationOutcome PerformSpeculative(ProcessSet& ps, const Response& r,
                                      std::chrono::steady_clock::duration* waited);

}  // namespace tfring

#endif  // TFRING_COMMON_SPECULATION_RUN_H
