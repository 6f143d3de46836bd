// Writability probes and free space (io/log/output_paths.h).
#include "io/log/output_paths.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tensor/check.h"

namespace cz {
namespace {

// Creates and removes a file in `dir`; the reason (strerror) when that fails, empty when it works.
std::string create_fails(const std::string& dir) {
  std::string probe = dir + "/.cz-write-probe-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

}  // namespace

void check_writable_dir(const std::string& dir, std::string_view flag) {
  CZ_CHECK_IO(!dir.empty(), "{}: the path is empty", flag);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  CZ_CHECK_IO(!ec, "{} {}: cannot create the folder: {}", flag, dir, ec.message());
  const std::string why = create_fails(dir);
  CZ_CHECK_IO(why.empty(), "{} {}: cannot write there: {}", flag, dir, why);
}

void check_writable_file(const std::string& path, std::string_view flag) {
  CZ_CHECK_IO(!path.empty(), "{}: the path is empty", flag);
  struct stat st {};
  CZ_CHECK_IO(::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode), "{} {}: is a folder, not a file", flag,
              path);
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  CZ_CHECK_IO(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "{} {}: the folder {} does not exist",
              flag, path, dir);
  const std::string why = create_fails(dir);
  CZ_CHECK_IO(why.empty(), "{} {}: cannot write in {}: {}", flag, path, dir, why);
}

int64_t free_bytes(const std::string& path) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) return -1;
  return int64_t(st.f_bavail) * int64_t(st.f_frsize);
}

}  // namespace cz
