// Finding helper programs beside the running one, then on PATH (io/h5/helper_programs.h).
#include "io/h5/helper_programs.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "tensor/check.h"

namespace cz {
namespace {

bool executable_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::optional<std::string> find_helper_in(const std::string& name, const std::string& self_dir,
                                          const std::string& path) {
  if (!self_dir.empty() && executable_file(self_dir + "/" + name)) return self_dir + "/" + name;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end == start ? "." : path.substr(start, end - start);
    if (executable_file(dir + "/" + name)) return dir + "/" + name;
    start = end + 1;
  }
  return std::nullopt;
}

std::string self_dir() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : self.parent_path().string();
}

std::string find_helper(const std::string& name, const std::string& what) {
  const std::string dir = self_dir();
  const char* path = std::getenv("PATH");
  const std::optional<std::string> found = find_helper_in(name, dir, path != nullptr ? path : "");
  CZ_CHECK_IO(found.has_value(),
              "cannot find {} ({}): not beside this program ({}) nor on PATH; the build puts it beside the "
              "programs and `cmake --install` installs it with them",
              what, name, dir.empty() ? "/proc/self/exe unreadable" : dir);
  return *found;
}

}  // namespace cz
