// Status and StatusOr<T>: the one error type inside the wsync C++ core.
//
// Every fallible function returns [[nodiscard]] Status or StatusOr<T>. A
// Status carries a code and one human-readable line that says what was
// wrong and where ("trainer.json: rank 3: tensor 'x': local_shape ...").
// Exceptions are used only at the Python boundary.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace wsync {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad input the user can fix (config, shapes, dtypes)
  kNotFound,          // unknown tensor, peer, file
  kOutOfRange,        // a write that would leave its region
  kFailedPrecondition,
  kUnavailable,       // peer unreachable, provider missing a capability
  kDeadlineExceeded,  // a peer did not answer in time
  kInternal,          // a system call or library call failed
  kAborted,           // an operation was cancelled (e.g. shutdown)
  kUnauthenticated,   // a request without a valid signature of the job secret
  kResourceExhausted, // a request or input over its size limit
  kDataLoss,          // bytes that are not what was sent (a checksum mismatch)
  kUnimplemented,     // not supported by this implementation (e.g. reading device memory)
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is "prefix: message" (no-op on OK).
  Status WithContext(const std::string& prefix) const;

  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// `text` cut to at most `max_bytes` (then "... (N bytes in all)"): what an
// error that quotes its input (a client's body, a file) may carry into a
// reply, a log line or a kept list. The problem is named, not the payload.
std::string Excerpt(const std::string& text, size_t max_bytes = 1024);

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status Unauthenticated(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit by design
    assert(!status.ok() && "StatusOr built from an OK Status has no value");
    if (status_.ok()) status_ = Internal("StatusOr constructed from OK status");
  }
  StatusOr(Status&& status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "StatusOr built from an OK Status has no value");
    if (status_.ok()) status_ = Internal("StatusOr constructed from OK status");
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  const T& value() const& { assert(ok()); return *value_; }
  T& value() & { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace wsync

#define WSYNC_CONCAT_INNER(a, b) a##b
#define WSYNC_CONCAT(a, b) WSYNC_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define WSYNC_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::wsync::Status wsync_status_ = (expr);          \
    if (!wsync_status_.ok()) return wsync_status_;   \
  } while (0)

// `WSYNC_ASSIGN_OR_RETURN(auto x, F())` binds x to F()'s value or returns its error.
#define WSYNC_ASSIGN_OR_RETURN(lhs, expr) \
  WSYNC_ASSIGN_OR_RETURN_IMPL(WSYNC_CONCAT(wsync_statusor_, __LINE__), lhs, expr)
#define WSYNC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
