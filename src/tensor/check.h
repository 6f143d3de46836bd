// Error types and check macros shared by every layer.
// CZ_CHECK* report caller errors (bad shapes, flags, files) as typed exceptions; CZ_ASSERT reports bugs in
// convnext_zero itself. CZ_CHECK_STATUS is the one generator for library status codes (CUDA, cuBLAS, cuDNN,
// NCCL, MPI, HDF5): each library supplies a StatusTraits specialisation next to the code that uses it.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace cz {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ShapeError : public Error {  // tensor shapes or strides do not fit the op
 public:
  using Error::Error;
};
class DtypeError : public Error {
 public:
  using Error::Error;
};
class DeviceError : public Error {  // tensors on different devices, or a device this build lacks
 public:
  using Error::Error;
};
class ValueError : public Error {  // a bad argument value or flag
 public:
  using Error::Error;
};
class IoError : public Error {  // files: missing, truncated, wrong keys, wrong dtypes
 public:
  using Error::Error;
};
class CommError : public Error {  // collectives: timeouts, dead peers, transport failures
 public:
  using Error::Error;
};
class InternalError : public Error {  // a bug in convnext_zero
 public:
  using Error::Error;
};

// "[rank 3] " once the communication layer knows the rank, empty before. Prefixed to status-code errors.
const std::string& log_prefix();
void set_log_prefix(std::string prefix);

namespace detail {
[[noreturn]] void throw_internal(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

// Traits for CZ_CHECK_STATUS: `static bool ok(Code)`, `static std::string describe(Code)`, `static const
// char* library`, and optionally `using error_type = ...` (an Error subclass, e.g. CommError for MPI/NCCL)
// for the exception thrown; plain Error otherwise. Specialised per library.
template <class Code>
struct StatusTraits;

template <class Code>
void check_status(Code code, const char* stmt, const char* file, int line) {
  using T = StatusTraits<Code>;
  if (T::ok(code)) return;
  std::string msg = fmt::format("{}{} error: {} in `{}` at {}:{}", log_prefix(), T::library,
                                T::describe(code), stmt, file, line);
  if constexpr (requires { typename T::error_type; })
    throw typename T::error_type(std::move(msg));
  else
    throw Error(std::move(msg));
}

}  // namespace cz

#define CZ_CHECK_T(ErrorType, cond, ...)         \
  do {                                           \
    if (!(cond)) [[unlikely]]                    \
      throw ErrorType(fmt::format(__VA_ARGS__)); \
  } while (0)

#define CZ_CHECK(cond, ...) CZ_CHECK_T(::cz::ValueError, cond, __VA_ARGS__)
#define CZ_CHECK_SHAPE(cond, ...) CZ_CHECK_T(::cz::ShapeError, cond, __VA_ARGS__)
#define CZ_CHECK_DTYPE(cond, ...) CZ_CHECK_T(::cz::DtypeError, cond, __VA_ARGS__)
#define CZ_CHECK_DEVICE(cond, ...) CZ_CHECK_T(::cz::DeviceError, cond, __VA_ARGS__)
#define CZ_CHECK_IO(cond, ...) CZ_CHECK_T(::cz::IoError, cond, __VA_ARGS__)

#define CZ_ASSERT(cond, ...)                                                                \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::cz::detail::throw_internal(#cond, __FILE__, __LINE__, fmt::format("" __VA_ARGS__)); \
  } while (0)

#define CZ_CHECK_STATUS(expr) ::cz::check_status((expr), #expr, __FILE__, __LINE__)
