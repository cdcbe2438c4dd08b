// Errors, the two kinds kiln keeps apart (STYLE.md rule 6):
//  * Status / Expected<T> for what a user can cause (bad file, bad request, bad flag, bad shape);
//  * KILN_CHECK for broken invariants: abort with file:line and a message.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace kiln {

enum class StatusCode {
  kOk,
  kInvalidArgument,     // the caller passed something malformed (shape, flag, request)
  kNotFound,            // a file, key or model that does not exist
  kOutOfRange,          // an index or size past a bound
  kResourceExhausted,   // out of memory, blocks, budget
  kFailedPrecondition,  // the system is not in a state to do this
  kUnimplemented,       // a path that does not exist (e.g. a SIMD target or dtype)
  kDataLoss,            // truncated or corrupted file
  kUnavailable,         // a peer or a device that cannot be reached
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

  // Aborts with the message when not ok: for callers that know the input is valid.
  void check_ok(const char* file, int line) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <class... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...)};
}
template <class... Args>
Status not_found(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...)};
}
template <class... Args>
Status out_of_range(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kOutOfRange, fmt::format(f, std::forward<Args>(args)...)};
}
template <class... Args>
Status resource_exhausted(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kResourceExhausted, fmt::format(f, std::forward<Args>(args)...)};
}
template <class... Args>
Status failed_precondition(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kFailedPrecondition, fmt::format(f, std::forward<Args>(args)...)};
}
template <class... Args>
Status unimplemented(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kUnimplemented, fmt::format(f, std::forward<Args>(args)...)};
}
template <class... Args>
Status data_loss(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kDataLoss, fmt::format(f, std::forward<Args>(args)...)};
}
template <class... Args>
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...)};
}

[[noreturn]] void fatal(const char* file, int line, const std::string& message);

// A value or the Status that says why there is none.
template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) fatal(__FILE__, __LINE__, "Expected built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  // Access; aborts with the error message when there is no value.
  T& value() & {
    if (!ok()) fatal(__FILE__, __LINE__, std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  const T& value() const& {
    if (!ok()) fatal(__FILE__, __LINE__, std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  T&& value() && {
    if (!ok()) fatal(__FILE__, __LINE__, std::get<Status>(v_).to_string());
    return std::move(std::get<T>(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kiln

// Broken invariant: abort with file:line. Never for user input.
#define KILN_CHECK(cond)                                                  \
  do {                                                                    \
    if (!(cond)) ::kiln::fatal(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)
#define KILN_CHECK_MSG(cond, ...)                                           \
  do {                                                                      \
    if (!(cond))                                                            \
      ::kiln::fatal(__FILE__, __LINE__,                                     \
                    std::string("check failed: " #cond ": ") + fmt::format(__VA_ARGS__)); \
  } while (0)

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Propagate a non-ok Status from a Status-returning expression.
#define KILN_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::kiln::Status kiln_status_ = (expr);          \
    if (!kiln_status_.ok()) return kiln_status_;   \
  } while (0)

// `KILN_ASSIGN_OR_RETURN(auto x, f());` binds the value or returns the Status.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_expected_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
