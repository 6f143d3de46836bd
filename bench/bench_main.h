// What the benchmark programs share at their edges: main's error report and the --json line they write.
#pragma once

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

namespace cz::bench {

// main's body: `run()`'s exit status, or 1 after "<program>: error: <what>" when it throws.
template <class Run>
int run_main(const char* program, Run&& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

// Writes `line` and a newline to `path` (--json); throws when the file cannot be written.
inline void write_json_line(const std::string& path, const std::string& line) {
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) throw std::runtime_error("cannot write --json " + path);
  std::fprintf(out, "%s\n", line.c_str());
  std::fclose(out);
}

}  // namespace cz::bench
