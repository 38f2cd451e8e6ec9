// Minimal leveled logging: one line per event, prefixed with the rank, to
// stderr. The level comes from Config (TFRING_LOG_LEVEL).
#ifndef TFRING_COMMON_LOGGING_H
#define TFRING_COMMON_LOGGING_H

#include <sstream>

#include "config.h"

namespace tfring {

void SetLogging(LogLevel level, bool timestamps, int rank);
bool LogEnabled(LogLevel level);

class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage();
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

}  // namespace tfring

#define TFRING_LOG(LEVEL)                                          \
  if (!::tfring::LogEnabled(::tfring::LogLevel::LEVEL)) {          \
  } else                                                           \
    ::tfring::LogMessage(::tfring::LogLevel::LEVEL).stream()

#endif  // TFRING_COMMON_LOGGING_H
