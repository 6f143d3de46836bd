// JSON-lines log file (Note [One log across resumes]), terminal progress bar, and printing beside the bar
// (Note [One console]).
#include "io/log/train_log.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>

#include "tensor/check.h"

namespace cz {
namespace {

// The step of a record that belongs to a step (training or evaluation); nullopt for the others (a run's
// start record, czrun's events).
std::optional<int64_t> step_of(const nlohmann::json& r) {
  if (!r.is_object()) return std::nullopt;
  const auto it = r.find("step");
  if (it == r.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::FILE* open_or_throw(const std::string& path, const char* mode) {
  std::FILE* f = std::fopen(path.c_str(), mode);
  CZ_CHECK_IO(f != nullptr, "--log {}: cannot open the file for writing: {}", path, std::strerror(errno));
  return f;
}

// `text` as the whole content of `path`, or nothing changed: a temporary beside it, synced, renamed over it.
void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CZ_CHECK_IO(fd >= 0, "--log {}: cannot write {}: {}", path, tmp, std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w <= 0) break;
    done += size_t(w);
  }
  const bool ok = done == text.size() && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    CZ_CHECK_IO(false, "--log {}: cannot rewrite the log: {}", path, std::strerror(e));
  }
}

std::mutex g_console;  // Note [One console]
std::string g_bar;     // the bar as last drawn, without its leading '\r'
volatile sig_atomic_t g_bar_drawn = 0;

// Wipes the bar's line (spaces, not an escape sequence, so any terminal does it). Holding g_console.
void wipe_bar() {
  std::fprintf(stderr, "\r%*s\r", int(g_bar.size()), "");
}

}  // namespace

JsonLog JsonLog::start(const std::string& path) {
  std::string note;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && st.st_size > 0) {
    std::string kept;
    for (int n = 1; kept.empty(); ++n)
      if (const std::string p = fmt::format("{}.{}", path, n); !exists(p)) kept = p;
    int64_t records = 0, last = -1;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line); ++records)
      if (auto s = step_of(nlohmann::json::parse(line, nullptr, false))) last = std::max(last, *s);
    CZ_CHECK_IO(::rename(path.c_str(), kept.c_str()) == 0, "--log {}: cannot move the existing log to {}: {}",
                path, kept, std::strerror(errno));
    note = fmt::format(
        "--log {}: the file held an earlier run's log ({} records{}); kept as {}, this run starts a new one "
        "(to continue that run, resume it with --resume)",
        path, records, last >= 0 ? fmt::format(", up to step {}", last) : "", kept);
  }
  return JsonLog(open_or_throw(path, "w"), path, note);
}

JsonLog JsonLog::resume(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return JsonLog(open_or_throw(path, "a"), path, "");
  std::string kept;
  int64_t dropped = 0, last_kept = -1, last_dropped = -1, cut = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (!r.is_object()) {
      ++cut;  // a line a crash cut short
      continue;
    }
    const std::optional<int64_t> s = step_of(r);
    if (s && *s > step) {
      ++dropped;
      last_dropped = std::max(last_dropped, *s);
      continue;
    }
    if (s) last_kept = std::max(last_kept, *s);
    kept += line + "\n";
  }
  in.close();
  if (dropped > 0 || cut > 0) replace_file(path, kept);
  std::string note;
  if (dropped > 0)
    note = fmt::format(
        "--log {}: continued after step {}; {} record(s) of steps {}-{}, logged past the checkpoint before "
        "the "
        "run ended, dropped (they are run again)",
        path, step, dropped, step + 1, last_dropped);
  else if (!kept.empty() && last_kept < step)
    note = fmt::format(
        "--log {}: continued, but it ends at step {}: steps {}-{} of the checkpoint are not in it", path,
        std::max<int64_t>(last_kept, 0), std::max<int64_t>(last_kept, 0) + 1, step);
  if (cut > 0)
    note += fmt::format("{}--log {}: {} line(s) that were not whole JSON objects dropped",
                        note.empty() ? "" : "; ", path, cut);
  return JsonLog(open_or_throw(path, "a"), path, note);
}

JsonLog::~JsonLog() {
  if (file_) std::fclose(file_);
}

void JsonLog::write(nlohmann::json record) {
  if (!file_) return;
  if (!record.contains("t")) record["t"] = unix_seconds();
  const std::string line = record.dump() + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  CZ_CHECK_IO(ok, "--log {}: write failed: {}", path_, std::strerror(errno));
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
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

double eta_seconds(int64_t first_step, int64_t step, int64_t total, double elapsed_s) {
  if (step <= first_step) return NAN;
  return elapsed_s / double(step - first_step) * double(total - step);
}

void console_print(std::FILE* stream, std::string_view text) {
  std::lock_guard<std::mutex> lock(g_console);
  if (g_bar_drawn) {
    wipe_bar();
    std::fflush(stderr);
  }
  std::fwrite(text.data(), 1, text.size(), stream);
  std::fflush(stream);
  if (g_bar_drawn) {
    std::fprintf(stderr, "\r%s", g_bar.c_str());
    std::fflush(stderr);
  }
}

void console_print_last(std::string_view text) {
  std::unique_lock<std::mutex> lock(g_console, std::try_to_lock);
  if (lock.owns_lock() && g_bar_drawn) {
    std::fputc('\n', stderr);
    g_bar_drawn = 0;
  }
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

bool progress_bar_drawn() {
  return g_bar_drawn != 0;
}

ProgressBar::ProgressBar(int64_t total_steps, ProgressMode mode, double interval_s, int64_t first_step)
    : total_(total_steps), mode_(mode), interval_s_(interval_s), first_step_(first_step) {}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::update(int64_t step, double loss, double img_per_s, double data_wait_fraction) {
  if (mode_ == ProgressMode::off) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = eta_seconds(first_step_, step, total_, elapsed);
  // Note [Data wait]: said only when it is what limits the run.
  const std::string loader =
      data_wait_fraction > kLoaderBoundFraction
          ? fmt::format("  loader-bound: {:.0f}% of step time waiting for data", 100 * data_wait_fraction)
          : "";
  if (mode_ == ProgressMode::lines) {
    if (last_line_s_ >= 0 && elapsed - last_line_s_ < interval_s_ && step < total_) return;
    last_line_s_ = elapsed;
    console_print(stderr,
                  fmt::format("step {}/{}  loss {:.4f}  {:.0f} img/s  elapsed {}  ETA {}{}\n", step, total_,
                              loss, img_per_s, format_duration(elapsed), format_duration(eta), loader));
    return;
  }
  constexpr int kWidth = 24;
  const double frac = total_ > 0 ? double(step) / double(total_) : 0.0;
  const int filled = int(frac * kWidth);
  std::string bar(size_t(kWidth), ' ');
  for (int i = 0; i < filled && i < kWidth; ++i) bar[size_t(i)] = '=';
  if (filled < kWidth) bar[size_t(filled)] = '>';
  std::lock_guard<std::mutex> lock(g_console);
  const std::string text = fmt::format("step {}/{} [{}] loss {:.4f}  {:.0f} img/s  ETA {}{}", step, total_,
                                       bar, loss, img_per_s, format_duration(eta), loader);
  if (g_bar_drawn && text.size() < g_bar.size()) wipe_bar();
  g_bar = text;
  std::fprintf(stderr, "\r%s", g_bar.c_str());
  std::fflush(stderr);
  g_bar_drawn = 1;
}

void ProgressBar::finish() {
  if (mode_ != ProgressMode::bar) return;
  std::lock_guard<std::mutex> lock(g_console);
  if (g_bar_drawn) std::fprintf(stderr, "\n");
  g_bar_drawn = 0;
}

}  // namespace cz
