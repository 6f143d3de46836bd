// Stopping a run on request (Note [Stopping on request]): SIGINT, SIGTERM and SIGUSR1 ask the training loop
// to stop after the step it is in, save a final checkpoint and exit with kExitStopped; a SIGINT or SIGTERM
// after the first signal stops at once. The ranks agree on it at each step boundary (StepBoundary).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dist/comm/process_group.h"

namespace cz::train {

// Exit codes of convnext_zero (docs/training.md).
inline constexpr int kExitFailed = 1;    // an error, printed
inline constexpr int kExitUsage = 2;     // a bad command line (unknown flag, bad value)
inline constexpr int kExitStopped = 75;  // stopped on request after saving what was asked for (EX_TEMPFAIL:
                                         // the run can be resumed)

// The stop "signal" of a run stopped before its Slurm job's end (--end-margin): not a signal number, so that
// signal_name() and the exit code treat it as a stop on request.
inline constexpr int kStopJobEnd = -1;

// Installs the handlers (replacing World's launcher-SIGTERM message). `announce`: this process prints the one
// "stopping after this step" line of the job (rank 0). Idempotent.
void install_stop_handlers(bool announce);
// Moves the stop signals onto a thread of their own (Note [Stop signals off the GEMM threads]): blocks them
// in the calling thread, which every thread it starts later inherits, and in OpenMP's threads, and starts
// the thread that takes them. Call from the main thread once MPI is up (a daemon that MPI_Init forks keeps
// the default mask) and before the first step. Idempotent; not undone.
void take_stop_signals_off_compute_threads();
// The first stop signal received (SIGINT, SIGTERM or SIGUSR1), 0 when none.
int stop_signal();
// The checkpoint a second signal's message names as the newest on disk ("" before the first is published).
void set_latest_checkpoint(const std::string& path);
// "SIGTERM", "SIGINT", "SIGUSR1", "the job's end time" (kStopJobEnd), or "signal N".
std::string signal_name(int sig);

// The stop record (Note [The stop record] in stop.cpp): CHECKPOINT_DIR/stopped, written by rank 0 once a
// stopped run's final checkpoint is published. Its first line is that checkpoint's folder name, as `latest`
// holds it ("step_N"); the second says what stopped the run. Nothing is written when no checkpoint of the run
// is on disk (`checkpoint` empty). A failure to write it is printed, not thrown: the stop itself succeeded.
inline constexpr const char* kStopRecordName = "stopped";
void write_stop_record(const std::string& checkpoint_dir, const std::string& checkpoint, int sig,
                       int64_t last_step);

// The ranks' agreement at a step boundary (Note [Stopping on request], Note [Stopping before the job's end]):
// whether the run stops, and whether every rank has written its part of the save in flight.
class StepBoundary {
 public:
  StepBoundary() = default;
  // `control`: the world's control group (Note [Control communicator]); `end_margin`: --end-margin's seconds
  // (0: none).
  StepBoundary(dist::ProcessGroup control, double end_margin);
  // --end-margin: the job's end time (Unix seconds), on rank 0.
  void set_job_end_time(std::optional<int64_t> end_time) { job_end_time_ = end_time; }
  // A step took `seconds`: the boundary keeps the margin for a next step as long as the slowest so far.
  void step_took(double seconds);

  struct Agreement {
    int signal = 0;       // the stop signal (of the first rank that has one), 0 to go on
    bool written = true;  // every rank's part of the save in flight is written (or none is in flight)
  };
  // Collective over `control`, after `step`: `unwritten` says this rank's part of a save in flight is not
  // written yet.
  Agreement agree(int64_t step, bool unwritten);

 private:
  dist::ProcessGroup control_;
  double end_margin_ = 0;
  std::optional<int64_t> job_end_time_;  // rank 0
  double longest_step_s_ = 0;            // this run's slowest step so far
};

}  // namespace cz::train
