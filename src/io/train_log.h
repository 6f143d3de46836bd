// Training logs: one JSON object per line in a file (--log), and a progress bar on a terminal.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace cz {

// Appends one JSON object per line and flushes it, so a crash loses at most the line being written and the
// file can be tailed while training runs. Opening truncates an existing file.
class JsonLog {
 public:
  JsonLog() = default;
  explicit JsonLog(const std::string& path);  // IoError naming the path if it cannot be created
  ~JsonLog();
  JsonLog(const JsonLog&) = delete;
  JsonLog& operator=(const JsonLog&) = delete;
  // Movable, so a member can be opened after construction (the trainer opens it on rank 0 only).
  JsonLog(JsonLog&& other) noexcept
      : file_(std::exchange(other.file_, nullptr)), path_(std::move(other.path_)) {}
  JsonLog& operator=(JsonLog&& other) noexcept {
    if (this != &other) {
      if (file_) std::fclose(file_);
      file_ = std::exchange(other.file_, nullptr);
      path_ = std::move(other.path_);
    }
    return *this;
  }
  void write(const nlohmann::json& record);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

// Progress on stderr. On a terminal, "step 120/300 [=======>      ] loss 1.234  2345 img/s  ETA 0:41" redrawn
// in place; elsewhere (a file, a pipe, mpirun's forwarding) one plain line per `interval_s` seconds, after
// the first step and after the last: "step 120/300  loss 1.2340  2345 img/s  elapsed 0:13  ETA 0:41".
enum class ProgressMode { off, bar, lines };

class ProgressBar {
 public:
  ProgressBar(int64_t total_steps, ProgressMode mode, double interval_s = 10);
  void update(int64_t step, double loss, double img_per_s);
  void finish();  // ends the bar's line

 private:
  int64_t total_;
  ProgressMode mode_;
  double interval_s_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_line_s_ = -1;  // seconds since start_ of the last plain line; -1 before the first
};

bool stderr_is_terminal();
std::string format_duration(double seconds);  // "1:05:09", "4:07"

}  // namespace cz
