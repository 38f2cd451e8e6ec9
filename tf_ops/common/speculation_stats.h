// Speculation's counters (speculation.h), kept apart so that the core's
// public face (operations.h: GetRuntimeParams) can report them without
// taking in speculation's machinery.
#ifndef TFRING_COMMON_SPECULATION_STATS_H
#define TFRING_COMMON_SPECULATION_STATS_H

#include <cstdint>

namespace tfring {

// Counted since init(), on this rank.
struct SpeculationStats {
  int64_t entered = 0;    // times speculative mode was entered
  int64_t responses = 0;  // speculative responses run and agreed
  int64_t fallbacks = 0;  // speculative responses that some rank flagged
  int64_t failures = 0;   // speculative responses whose data plane failed
};

}  // namespace tfring

#endif  // TFRING_COMMON_SPECULATION_STATS_H
