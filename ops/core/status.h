// Status: the one way errors travel through the core. A request finishes with exactly one
// Status; it becomes a TensorFlow status or a Python exception only at the edge.
#pragma once

#include <string>
#include <utility>

namespace mlsl {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument = 1,    // the caller's input is wrong (checked on this rank alone)
  kFailedPrecondition = 2, // used before init; the ranks' submissions disagree or one is invalid
  kAborted = 3,            // shut down, or a peer shut down, while the request was pending
  kInternal = 4,           // MPI or the runtime itself failed
  kUnavailable = 5,        // a peer rank shut down or failed: collectives can no longer complete
};

// Where the TensorFlow binding puts the code on an op's error (a status payload, read by
// mlsl_tf/_library.py): the decimal StatusCode.
constexpr const char* kStatusCodePayload = "mlsl_tf.status_code";

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
  static Status FailedPrecondition(std::string m) { return Status(StatusCode::kFailedPrecondition, std::move(m)); }
  static Status Aborted(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
  static Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
  static Status Unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
  static Status WithCode(StatusCode c, std::string m) { return Status(c, std::move(m)); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(StatusCode c, std::string m) : code_(c), message_(std::move(m)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace mlsl
