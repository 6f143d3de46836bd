// Scratch files for the path-based fuzz targets.
#include "fuzz_files.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace cz::fuzz {

std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  // One directory per process: parallel fuzzing jobs must not share files.
  static const std::string dir = [] {
    std::string templ = (std::filesystem::temp_directory_path() / "cz_fuzz_XXXXXX").string();
    if (!mkdtemp(templ.data())) std::abort();
    return templ;
  }();
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return dir;
}

}  // namespace cz::fuzz
