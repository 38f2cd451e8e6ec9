// Status: the one way errors travel from the core up to the framework layer.
// The core never aborts on bad input; it returns a Status whose message is shown
// to the user by the TF kernel (mapped to a tf.errors.* type) or by Python.
#ifndef TFRING_COMMON_STATUS_H
#define TFRING_COMMON_STATUS_H

#include <string>
#include <utility>

namespace tfring {

enum class StatusCode : int {
  OK = 0,
  UNKNOWN = 1,
  PRECONDITION_ERROR = 2,  // cross-rank mismatch, not initialised -> FailedPreconditionError
  ABORTED = 3,             // shut down, a rank failed -> AbortedError
  INVALID_ARGUMENT = 4,    // bad argument on this rank -> InvalidArgumentError
  IN_PROGRESS = 5,
};

class Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status Unknown(std::string m) { return Status(StatusCode::UNKNOWN, std::move(m)); }
  static Status PreconditionError(std::string m) {
    return Status(StatusCode::PRECONDITION_ERROR, std::move(m));
  }
  static Status Aborted(std::string m) { return Status(StatusCode::ABORTED, std::move(m)); }
  static Status InvalidArgument(std::string m) {
    return Status(StatusCode::INVALID_ARGUMENT, std::move(m));
  }
  static Status InProgress() { return Status(StatusCode::IN_PROGRESS, ""); }

  bool ok() const { return code_ == StatusCode::OK; }
  bool in_progress() const { return code_ == StatusCode::IN_PROGRESS; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(StatusCode c, std::string m) : code_(c), message_(std::move(m)) {}
  StatusCode code_ = StatusCode::OK;
  std::string message_;
};

#define TFRING_RETURN_IF_ERROR(expr)      \
  do {                                    \
    ::tfring::Status _s = (expr);         \
    if (!_s.ok()) return _s;              \
  } while (0)

}  // namespace tfring

#endif  // TFRING_COMMON_STATUS_H
