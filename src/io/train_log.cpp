// JSON-lines log file and terminal progress bar.
#include "io/train_log.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "tensor/check.h"

namespace cz {

JsonLog::JsonLog(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "w");
  CZ_CHECK_IO(file_ != nullptr, "--log {}: cannot create the file: {}", path, std::strerror(errno));
}

JsonLog::~JsonLog() {
  if (file_) std::fclose(file_);
}

void JsonLog::write(const nlohmann::json& record) {
  if (!file_) return;
  const std::string line = record.dump() + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  CZ_CHECK_IO(ok, "--log {}: write failed: {}", path_, std::strerror(errno));
}

bool stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = int64_t(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

ProgressBar::ProgressBar(int64_t total_steps, ProgressMode mode, double interval_s)
    : total_(total_steps), mode_(mode), interval_s_(interval_s) {}

void ProgressBar::update(int64_t step, double loss, double img_per_s) {
  if (mode_ == ProgressMode::off) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = step > 0 ? elapsed / double(step) * double(total_ - step) : NAN;
  if (mode_ == ProgressMode::lines) {
    if (last_line_s_ >= 0 && elapsed - last_line_s_ < interval_s_ && step < total_) return;
    last_line_s_ = elapsed;
    std::fprintf(stderr, "step %lld/%lld  loss %.4f  %.0f img/s  elapsed %s  ETA %s\n", (long long)step,
                 (long long)total_, loss, img_per_s, format_duration(elapsed).c_str(),
                 format_duration(eta).c_str());
    std::fflush(stderr);
    return;
  }
  constexpr int kWidth = 24;
  const double frac = total_ > 0 ? double(step) / double(total_) : 0.0;
  const int filled = int(frac * kWidth);
  std::string bar(size_t(kWidth), ' ');
  for (int i = 0; i < filled && i < kWidth; ++i) bar[size_t(i)] = '=';
  if (filled < kWidth) bar[size_t(filled)] = '>';
  std::fprintf(stderr, "\rstep %lld/%lld [%s] loss %.4f  %.0f img/s  ETA %s   ", (long long)step,
               (long long)total_, bar.c_str(), loss, img_per_s, format_duration(eta).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (mode_ == ProgressMode::bar && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace cz
