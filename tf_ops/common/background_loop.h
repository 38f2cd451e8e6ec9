// The background thread: every cycle it negotiates each process set's
// ready tensors, runs the responses (speculated ones through
// speculation_run.h), applies autotuned values and checks for stalls, then
// waits for work. A submitting thread may run the global set's speculated
// responses itself (DriveInline). Internal to tf_ops/common.
#ifndef TFRING_COMMON_BACKGROUND_LOOP_H
#define TFRING_COMMON_BACKGROUND_LOOP_H

#include <string>

#include "process_set.h"

namespace tfring {

// The thread's body: runs until the job stops, then fails what is pending
// and frees the communicators.
void BackgroundLoop();
// Starts a cycle at once instead of at the next tick.
void WakeBackground();
// The device watchdog found a failure (a dead peer under device work): the
// loop stops at its next cycle as if its own round had found it, failing
// what is queued with `why` (its cause and rank). Any thread; never waits
// for a cycle.
void StopForDeviceFailure(const Status& why);
// Asks every rank to stop (in the next negotiation round); `reason` is what
// the other ranks' errors will say, `cause` (SHUTDOWN, or TIMEOUT for a
// stall) what kind of failure they get, and `rank` the rank they name (this
// one for a shutdown, the first rank a stalled tensor waits for; -1: none).
void RequestShutdown(FailureCause cause, const std::string& reason, int rank);
// Runs the global set's next speculated responses on the thread that just
// submitted a tensor, when no other thread drives: in the steady state that
// saves two thread hand-offs per collective (waking the background thread,
// and TF waking another thread for the op that consumes the result, since a
// callback run on a TF thread queues that op on the same thread), each a
// sleep and a wake-up of tens of microseconds. The cycle is the background
// thread's own (RunLoopOnce) under the driving lock, so every rank still runs the
// same responses in the same order. Returns false when the background
// thread must take over: nothing was tried (not speculating, another thread
// drives, shutting down, TFRING_SPECULATION_INLINE=0), the cycle ran
// nothing (the next response needs tensors not yet submitted), or it ended
// speculation (a fallback: what was held is negotiated again) or the job.
//
// Only while the ranks run in step, as in a chain of collectives: the last
// responses ran less than kInlineGap ago and found their peers there.
// Otherwise a peer may still be computing (the first gradient of a training
// step), and the submitting thread, one of TF's compute threads, would wait
// for it instead of computing; the background thread waits then.
bool DriveInline(ProcessSet& ps);

}  // namespace tfring

#endif  // TFRING_COMMON_BACKGROUND_LOOP_H
