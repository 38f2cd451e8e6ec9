#include "timeline.h"

#include <sstream>

namespace tfring {
namespace {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Status Timeline::Start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_) {
    // A new start replaces the running timeline, which is closed as valid JSON.
    std::fputs("\n]\n", file_);
    std::fclose(file_);
  }
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) return Status::InvalidArgument("tfring: cannot open timeline file " + path);
  std::fputs("[\n", file_);
  first_ = true;
  rows_.clear();
  origin_ = Clock::now();
  mark_cycles_ = mark_cycles;
  enabled_ = true;
  return Status::OK();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  enabled_ = false;
  if (!file_) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

int64_t Timeline::Micros(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
}

void Timeline::Write(const std::string& event) {
  if (!file_) return;
  if (!first_) std::fputs(",\n", file_);
  first_ = false;
  std::fputs(event.c_str(), file_);
}

int Timeline::RowFor(const std::string& name) {
  auto it = rows_.find(name);
  if (it != rows_.end()) return it->second;
  const int row = static_cast<int>(rows_.size()) + 1;
  rows_[name] = row;
  Write("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(row) +
        ", \"args\": {\"name\": \"" + Escape(name) + "\"}}");
  Write("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + std::to_string(row) +
        ", \"args\": {\"sort_index\": " + std::to_string(row) + "}}");
  return row;
}

void Timeline::NegotiateStart(const std::string& name, const char* collective) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  const int row = RowFor(name);
  Write("{\"name\": \"NEGOTIATE_" + std::string(collective) + "\", \"ph\": \"B\", \"ts\": " +
        std::to_string(Micros(Clock::now())) + ", \"pid\": " + std::to_string(row) +
        ", \"tid\": 0}");
}

void Timeline::NegotiateRankReady(const std::string& name, int rank) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  const int row = RowFor(name);
  Write("{\"name\": \"" + std::to_string(rank) + "\", \"ph\": \"i\", \"s\": \"t\", \"ts\": " +
        std::to_string(Micros(Clock::now())) + ", \"pid\": " + std::to_string(row) +
        ", \"tid\": 0}");
}

void Timeline::NegotiateEnd(const std::string& name) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  const int row = RowFor(name);
  const std::string ts = std::to_string(Micros(Clock::now()));
  Write("{\"ph\": \"E\", \"ts\": " + ts + ", \"pid\": " + std::to_string(row) + ", \"tid\": 0}");
  Write("{\"name\": \"QUEUE\", \"ph\": \"B\", \"ts\": " + ts + ", \"pid\": " +
        std::to_string(row) + ", \"tid\": 0}");
}

void Timeline::Activity(const std::string& name, const std::string& activity,
                        Clock::time_point start) {
  if (!enabled()) return;
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  const int row = RowFor(name);
  Write("{\"name\": \"" + Escape(activity) + "\", \"ph\": \"X\", \"ts\": " +
        std::to_string(Micros(start)) + ", \"dur\": " +
        std::to_string(std::max<int64_t>(0, Micros(now) - Micros(start))) + ", \"pid\": " +
        std::to_string(row) + ", \"tid\": 1}");
}

void Timeline::End(const std::string& name) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  const int row = RowFor(name);
  Write("{\"ph\": \"E\", \"ts\": " + std::to_string(Micros(Clock::now())) + ", \"pid\": " +
        std::to_string(row) + ", \"tid\": 0}");
}

void Timeline::MarkCycle() {
  if (!enabled() || !mark_cycles_) return;
  std::lock_guard<std::mutex> lock(mu_);
  Write("{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"ts\": " +
        std::to_string(Micros(Clock::now())) + ", \"pid\": 0, \"tid\": 0}");
}

}  // namespace tfring
