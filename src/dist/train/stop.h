// Stopping a run on request (Note [Stopping on request]): SIGINT, SIGTERM and SIGUSR1 ask the training loop
// to stop after the step it is in, save a final checkpoint and exit with kExitStopped; a SIGINT or SIGTERM
// after the first signal stops at once.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace cz::train
