// The tiny check harness shared by the C++ test programs: a failed CHECK is
// reported with its line and counted, and the program goes on, so one run
// lists every failure; CheckExitCode() prints the tally for the pytest
// wrappers to read and turns it into the exit status.
#ifndef TFRING_COMMON_TESTS_CHECK_H
#define TFRING_COMMON_TESTS_CHECK_H

#include <cstdio>
#include <string>

inline int g_failures = 0;
inline int g_checks = 0;
// The rank a multi-rank test program runs as (-1: none), to prefix failures.
inline int g_check_rank = -1;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    ++g_checks;                                                                     \
    if (!(cond)) {                                                                  \
      ++g_failures;                                                                 \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                               \
  } while (0)

// CHECK with a printf-style message (what was being done, the values seen);
// the first 30 failures are printed, all are counted.
#define CHECKF(cond, ...)                                                            \
  do {                                                                               \
    ++g_checks;                                                                      \
    if (!(cond)) {                                                                   \
      if (++g_failures <= 30) {                                                      \
        std::fprintf(stderr, "[rank %d] %s:%d: CHECK failed: %s ", g_check_rank,     \
                     __FILE__, __LINE__, #cond);                                     \
        std::fprintf(stderr, __VA_ARGS__);                                           \
        std::fprintf(stderr, "\n");                                                  \
      }                                                                              \
    }                                                                                \
  } while (0)

inline bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline int CheckExitCode() {
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

#endif  // TFRING_COMMON_TESTS_CHECK_H
