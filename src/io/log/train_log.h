// Training logs: one JSON object per line in a file (--log), a progress bar on a terminal, and the one way
// to print a message while that bar is drawn.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace cz {

// Appends one JSON object per line, each with "t" (Unix seconds), and flushes it, so a crash loses at most
// the line being written and the file can be tailed while training runs.
//
// Note [One log across resumes]: a run started afresh never overwrites an existing log: a non-empty file is
// renamed to the first free PATH.N (PATH.1, PATH.2, ...) and note() says so. A resumed run continues the
// file: the records of steps after the checkpoint's step (which a stopped or killed run may have logged
// before it ended) are dropped, the file rewritten atomically (a temporary beside it, synced, renamed over
// it), and the new records appended, so a reader sees each step once, in order, across any number of resumes.
class JsonLog {
 public:
  JsonLog() = default;
  // A run from step 0. IoError naming the path if it cannot be created or the old file cannot be moved.
  static JsonLog start(const std::string& path);
  // A run resumed from a checkpoint of `step`: keeps the records up to it, appends after them.
  static JsonLog resume(const std::string& path, int64_t step);
  ~JsonLog();
  JsonLog(const JsonLog&) = delete;
  JsonLog& operator=(const JsonLog&) = delete;
  // Movable, so a member can be opened after construction (the trainer opens it on rank 0 only).
  JsonLog(JsonLog&& other) noexcept
      : file_(std::exchange(other.file_, nullptr)),
        path_(std::move(other.path_)),
        note_(std::move(other.note_)) {}
  JsonLog& operator=(JsonLog&& other) noexcept {
    if (this != &other) {
      if (file_) std::fclose(file_);
      file_ = std::exchange(other.file_, nullptr);
      path_ = std::move(other.path_);
      note_ = std::move(other.note_);
    }
    return *this;
  }
  // Adds "t" (Unix seconds) unless the record has it.
  void write(nlohmann::json record);
  bool is_open() const { return file_ != nullptr; }
  // What opening did to an existing file ("--log run.jsonl: ... kept as run.jsonl.1"); "" when nothing.
  const std::string& note() const { return note_; }

 private:
  JsonLog(std::FILE* file, std::string path, std::string note)
      : file_(file), path_(std::move(path)), note_(std::move(note)) {}
  std::FILE* file_ = nullptr;
  std::string path_;
  std::string note_;
};

double unix_seconds();  // now, as the records' "t"

// Progress on stderr. On a terminal, "step 120/300 [=======>      ] loss 1.234  2345 img/s  ETA 0:41" redrawn
// in place; elsewhere (a file, a pipe, mpirun's forwarding) one plain line per `interval_s` seconds, after
// the first step and after the last: "step 120/300  loss 1.2340  2345 img/s  elapsed 0:13  ETA 0:41".
// The ETA counts only the steps this process has run: a run resumed at step 200 of 240 estimates the 40 left
// from the time its own steps took, not from 200 steps it never ran.
enum class ProgressMode { off, bar, lines };

// Note [Data wait]: a step's data_wait_s is the time its rank waited in the loader for the step's batches
// (the workers had not finished them), part of step_time_s; each log record has it, rank 0's like the other
// per-rank figures. The progress and the closing summary judge the loader by the fraction of step time spent
// waiting over the steps after this process's first, whose wait is the pipeline's fill (the workers start
// with the run), not its pace. Above kLoaderBoundFraction the loader is the bottleneck: the model waits for
// images one step in ten or more, so more --loader-threads (or cores) would speed the run up. Below it the
// wait is the hand-over of a batch and the odd slow image. ConvNeXt-atto at 32 px on 2 cores with synthetic
// data waits under 1%; 600 px JPEGs decoded by one thread for the same model wait most of each step.
inline constexpr double kLoaderBoundFraction = 0.10;

class ProgressBar {
 public:
  // `first_step`: the step the run starts from (the checkpoint's, when resumed).
  ProgressBar(int64_t total_steps, ProgressMode mode, double interval_s = 10, int64_t first_step = 0);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  // `data_wait_fraction`: of step time, the part spent waiting for data (Note [Data wait]); the line says
  // when the loader is the bottleneck. NaN: not known yet.
  void update(int64_t step, double loss, double img_per_s, double data_wait_fraction = NAN);
  void finish();  // ends the bar's line; the bar stays on screen

 private:
  int64_t total_;
  ProgressMode mode_;
  double interval_s_;
  int64_t first_step_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_line_s_ = -1;  // seconds since start_ of the last plain line; -1 before the first
};

// Seconds left after `step` of `total`, at the pace of the steps from `first_step` to `step` that took
// `elapsed_s`; NaN before the first of them.
double eta_seconds(int64_t first_step, int64_t step, int64_t total, double elapsed_s);

// Note [One console]: every line rank 0 prints while a run's progress bar is drawn goes through here, so it
// never lands on the bar's line: the bar is wiped, the text printed (and flushed) on `stream`, and the bar
// drawn again below it, as tqdm.write does. Without a bar it is a print and a flush. Thread-safe. `text`
// holds whole lines, newlines included.
void console_print(std::FILE* stream, std::string_view text);
// The last words of a process that exits next (a second stop signal), on stderr: the bar stays on its line
// and the text starts below it. It never waits for a print in progress (that one may be what is stuck): then
// the text goes out as it is.
void console_print_last(std::string_view text);
// Whether a bar is on the terminal's current line; async-signal-safe (a stop handler starts a new line then).
bool progress_bar_drawn();

bool stderr_is_terminal();
std::string format_duration(double seconds);  // "1:05:09", "4:07"

}  // namespace cz
