// The core's public face: what framework bindings (the TF kernels and the
// Python module) call. Everything here is thread-safe.
#ifndef TFRING_COMMON_OPERATIONS_H
#define TFRING_COMMON_OPERATIONS_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "speculation_stats.h"
#include "status.h"
#include "tensor_queue.h"

namespace tfring {

constexpr int32_t kGlobalProcessSetId = 0;
// The reserved name of a rank's pending join() in each process set.
extern const char* const kJoinTensorName;

class Backend;

// Starts tfring over `backend` (a transport's, see process_set.h): learns the
// topology, starts the peer monitor, builds the global process set and starts
// the background thread. Idempotent while running (`backend` is then
// dropped); after shutdown() it starts afresh. A binding starts a transport
// by name (StartTransport, transport/registry.h), which makes its backend.
// `config` is what the transport made the backend with (read once from the
// environment).
Status Initialize(std::unique_ptr<Backend> backend, const Config& config);
// What Initialize would decide before it gets a backend: sets *running and
// returns OK when tfring runs already; returns the error when it cannot start
// again in this process (the communication of a backend that cannot restart
// broke earlier). A transport calls it before making its backend, because
// making one on broken communication may hang.
Status CheckCanStart(bool* running);
// Asks every rank to stop, waits for the background thread, fails whatever
// is still pending. `reason` is what the other ranks' errors will say about
// this rank (e.g. the exception its script died of). Safe to call twice.
Status Shutdown(const std::string& reason = "");
bool IsInitialized();
// OK when collectives can be submitted; otherwise the error to show the user.
Status CheckInitialized();
// OK once init() has succeeded, even if the job has stopped since: rank() and
// size() stay meaningful in an error handler.
Status CheckTopologyKnown();

int Rank();
int Size();
int LocalRank();
int LocalSize();
int CrossRank();
int CrossSize();
bool IsHomogeneous();
bool MPIThreadsSupported();
// True once a peer died or the transport failed (until a restartable backend
// starts again): MPI must then not be finalised.
bool CommunicationBroken();

// Submits one collective. On error the entry's callback is not called; an
// error in the entry's own arguments (after the process set is known) also
// abandons it (below), so the set's other ranks are not left waiting.
Status Enqueue(int32_t process_set_id, TensorTableEntry entry);
// Tells the process set's coordinator that this rank raised `why` instead of
// submitting `entry` (only its name, kind and group are used): the
// collective fails on every rank that submitted it, with an error naming
// this rank. Nothing is sent when a collective of that name is already in
// flight here (a duplicate name raises on this rank alone), nor by a rank
// outside the set, nor before init or after shutdown.
void Abandon(int32_t process_set_id, const TensorTableEntry& entry, const Status& why);

// Collective over all ranks; blocks until every rank has made the same call.
Status AddProcessSet(const std::vector<int>& ranks, int32_t* id);
Status RemoveProcessSet(int32_t id);
// rank is -1 when this process is not a member.
Status GetProcessSet(int32_t id, int* rank, std::vector<int>* ranks);
std::vector<int32_t> ProcessSetIds();

// The values in force now (autotune may change them; all ranks agree), and
// the global set's speculation since init() on this rank.
struct RuntimeParams {
  int64_t fusion_threshold_bytes;
  double cycle_time_ms;
  int64_t shm_min_bytes;
  bool autotune_done;  // on rank 0 with TFRING_AUTOTUNE=1: the search has ended
  SpeculationStats speculation;
  // Speculated responses run by the submitting thread itself
  // (TFRING_SPECULATION_INLINE), not the background thread.
  int64_t inline_responses = 0;
};
RuntimeParams GetRuntimeParams();

// Collectives this rank has submitted that have not started running (they
// wait for the other ranks, or for the next cycle), over every process set:
// what a test waits on to know a collective is in flight, rather than
// sleeping for long enough.
int64_t QueuedCollectives();

// Starts/stops recording the timeline (Chrome trace JSON). Only rank 0
// writes; on other ranks these do nothing.
Status StartTimeline(const std::string& path, bool mark_cycles);
void StopTimeline();

}  // namespace tfring

#endif  // TFRING_COMMON_OPERATIONS_H
