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

#define CHECK(cond)                                                                 \
  do {                                                                              \
    ++g_checks;                                                                     \
    if (!(cond)) {                                                                  \
      ++g_failures;                                                                 \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                               \
  } while (0)

inline bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline int CheckExitCode() {
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

#endif  // TFRING_COMMON_TESTS_CHECK_H
