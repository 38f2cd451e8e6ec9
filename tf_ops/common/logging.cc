#include "logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace tfring {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::WARNING)};
std::atomic<bool> g_timestamps{false};
std::atomic<int> g_rank{-1};

const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::TRACE: return "TRACE";
    case LogLevel::DEBUG: return "DEBUG";
    case LogLevel::INFO: return "INFO";
    case LogLevel::WARNING: return "WARNING";
    case LogLevel::ERROR: return "ERROR";
    case LogLevel::FATAL: return "FATAL";
  }
  return "?";
}
}  // namespace

void SetLogging(LogLevel level, bool timestamps, int rank) {
  g_level = static_cast<int>(level);
  g_timestamps = timestamps;
  g_rank = rank;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

LogMessage::~LogMessage() {
  char stamp[64] = "";
  if (g_timestamps) {
    auto now = std::chrono::system_clock::now();
    std::time_t t = std::chrono::system_clock::to_time_t(now);
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()) %
              std::chrono::seconds(1);
    std::tm tm;
    localtime_r(&t, &tm);
    size_t n = std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
    std::snprintf(stamp + n, sizeof(stamp) - n, ".%06ld ", static_cast<long>(us.count()));
  }
  std::fprintf(stderr, "%s[tfring %s rank %d] %s\n", stamp, LevelName(level_), g_rank.load(),
               os_.str().c_str());
}

}  // namespace tfring
