// Error helpers: the rank prefix and internal-error formatting.
#include "tensor/check.h"

#include <mutex>

namespace cz {
namespace {
std::string& prefix_storage() {
  static std::string prefix;
  return prefix;
}
}  // namespace

const std::string& log_prefix() {
  return prefix_storage();
}
void set_log_prefix(std::string prefix) {
  prefix_storage() = std::move(prefix);
}

namespace detail {
void throw_internal(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(fmt::format("{}internal error (a bug in convnext_zero): `{}` failed at {}:{}{}{}",
                                  log_prefix(), cond, file, line, msg.empty() ? "" : ": ", msg));
}
}  // namespace detail
}  // namespace cz
