// Status: the one way errors travel from the core up to the framework layer.
// The core never aborts on bad input; it returns a Status whose message is shown
// to the user by the TF kernel (mapped to a tf.errors.* type) or by Python.
//
// A Status has two independent parts: its code picks the tf.errors type users
// catch (Horovod's), and its cause says why it failed, for code that must
// react (elastic recovery, the Ray and Spark drivers). Nothing above the core
// reads the message to learn the cause: a failure keeps its cause (and the
// failing rank) from where it is born up to Python, also when a layer on the
// way adds words to its message (WithMessage).
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

// Why an operation failed. The values travel (Python, TF status payloads,
// the negotiation wire's shutdown notice): append, never renumber. The
// Python names are in tfring/common/exceptions.py (Cause) and docs/errors.md.
enum class FailureCause : int {
  NONE = 0,              // OK or in progress
  UNKNOWN = 1,           // an internal error (an allocation, a malformed message)
  SHUTDOWN = 2,          // a rank called shutdown() or its script ended; rank() names it
  PEER_FAILURE = 3,      // a peer died, left, went silent or broke the protocol;
                         // rank() names it when known (-1 when not)
  MISMATCH = 4,          // ranks asked for different things (the coordinator's verdict)
  INVALID_ARGUMENT = 5,  // a bad argument or setting on this rank
  TIMEOUT = 6,           // a stall past TFRING_STALL_SHUTDOWN_TIME_SECONDS, a start-up timeout
  NOT_INITIALIZED = 7,   // tfring is not running on this rank (before init, after shutdown)
};

class Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status Unknown(std::string m) {
    return Status(StatusCode::UNKNOWN, FailureCause::UNKNOWN, std::move(m));
  }
  // Without a cause: the coordinator's verdict that ranks disagree, which
  // reaches every rank as a Response's error message.
  static Status PreconditionError(std::string m, FailureCause cause = FailureCause::MISMATCH) {
    return Status(StatusCode::PRECONDITION_ERROR, cause, std::move(m));
  }
  static Status Mismatch(std::string m) { return PreconditionError(std::move(m)); }
  // A setting (the environment, the MPI start-up) that stops tfring starting.
  static Status Misconfigured(std::string m) {
    return PreconditionError(std::move(m), FailureCause::INVALID_ARGUMENT);
  }
  static Status NotInitialized(std::string m) {
    return PreconditionError(std::move(m), FailureCause::NOT_INITIALIZED);
  }
  // Communication with the other ranks broke; a failure whose peer is known
  // says so with PeerFailed.
  static Status Aborted(std::string m) {
    return Status(StatusCode::ABORTED, FailureCause::PEER_FAILURE, std::move(m));
  }
  static Status PeerFailed(int rank, std::string m) {
    return Status(StatusCode::ABORTED, FailureCause::PEER_FAILURE, std::move(m), rank);
  }
  // `rank` asked the job to stop (-1: this rank's own shutdown, or unknown).
  static Status Shutdown(std::string m, int rank = -1) {
    return Status(StatusCode::ABORTED, FailureCause::SHUTDOWN, std::move(m), rank);
  }
  static Status Timeout(std::string m) {
    return Status(StatusCode::ABORTED, FailureCause::TIMEOUT, std::move(m));
  }
  static Status InvalidArgument(std::string m) {
    return Status(StatusCode::INVALID_ARGUMENT, FailureCause::INVALID_ARGUMENT, std::move(m));
  }
  static Status InProgress() { return Status(StatusCode::IN_PROGRESS, FailureCause::NONE, ""); }
  // Any combination, for a status rebuilt from the wire or another library.
  static Status Make(StatusCode code, FailureCause cause, std::string m, int rank = -1) {
    return Status(code, cause, std::move(m), rank);
  }

  bool ok() const { return code_ == StatusCode::OK; }
  bool in_progress() const { return code_ == StatusCode::IN_PROGRESS; }
  StatusCode code() const { return code_; }
  FailureCause cause() const { return cause_; }
  // The failing rank (peer failure) or the rank that shut the job down; -1
  // when there is none or it is not known.
  int rank() const { return rank_; }
  const std::string& message() const { return message_; }

  // The same failure (code, cause, rank) told in other words: a layer that
  // names the step that failed keeps what the failure is.
  Status WithMessage(std::string m) const {
    Status s = *this;
    s.message_ = std::move(m);
    return s;
  }

 private:
  Status(StatusCode c, FailureCause cause, std::string m, int rank = -1)
      : code_(c), cause_(cause), rank_(rank), message_(std::move(m)) {}
  StatusCode code_ = StatusCode::OK;
  FailureCause cause_ = FailureCause::NONE;
  int rank_ = -1;
  std::string message_;
};

#define TFRING_RETURN_IF_ERROR(expr)      \
  do {                                    \
    ::tfring::Status _s = (expr);         \
    if (!_s.ok()) return _s;              \
  } while (0)

}  // namespace tfring

#endif  // TFRING_COMMON_STATUS_H
