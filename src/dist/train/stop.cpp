// Stop signals. Note [Stopping on request]:
// - A signal only records itself (handlers may call nothing but async-signal-safe functions). The training
//   loop reads it at each step boundary, where the ranks agree on it in one small all-gather (Trainer::
//   step_boundary), so every rank stops after the same step even when the signal reached them on either
//   side of a boundary; the stop then finishes the save in flight, writes a final checkpoint and the
//   --export-weights file, and rank 0 prints one message for the job.
// - A second SIGINT or SIGTERM means "now": the process exits at once with 128 + signal. Whatever a save had
//   written is left in a .tmp- folder that no reader looks at, so the newest published checkpoint stays
//   loadable. A SIGUSR1 never does: it is the signal launchers forward and job scripts relay (mpirun and srun
//   pass it on; czrun and examples/slurm/train.sbatch hand a SIGTERM on as SIGUSR1), so one request can reach
//   a rank several times. `scancel --full --signal=USR1` under srun sends it to the ranks, to srun, which
//   forwards it, and to the job script, which relays it: on the Slurm test cluster the second copy ended the
//   ranks before their final save. After a SIGTERM a rank can also get the script's SIGUSR1 (--full).
// - Open MPI 4.1's mpirun answers SIGINT and SIGTERM by waiting odls_base_sigkill_timeout seconds (T, 1 by
//   default), sending every rank SIGTERM, and SIGKILLing them T seconds later: the ranks have T for the step
//   and the final save. It forwards SIGUSR1 and leaves the ranks alone, so SIGUSR1 to mpirun stops with no
//   deadline. Ranks run in their own process groups, so a terminal's Ctrl-C reaches them only through mpirun.
// - Rank 0's lines about a stop all go to stderr: the stop thread's (below), and the
//   closing "stopped by ..." and "resume with: ..." (convnext_zero.cpp). mpirun forwards a rank's stdout and
//   stderr through two pipes and interleaves them as it reads them, which printed the closing line before
//   the handler's; one stream keeps them in the order written.
//
// Note [Three SIGTERM handlers]: a SIGTERM means something different to each of three kinds of process, so
// each installs its own handler; all three only record the signal or write(2), as handlers must.
// - Any rank of an MPI program (World::init in src/dist/comm/bootstrap.cpp: commbench, the test programs):
//   the launcher is ending the job because another rank failed. The handler says what this rank was doing
//   (Note [Activity for signals]) and exits with 128 + signal, so that the output names the stuck collective.
// - A training rank (install_stop_handlers, here, which convnext_zero installs right after World::init in
//   place of the first): SIGTERM, SIGINT and SIGUSR1 ask for a stop after the step with a final checkpoint,
//   a second one for an exit at once (Note [Stopping on request], above).
// - czrun's supervisor (src/dist/elastic/supervisor.cpp, not an MPI process): a signal to czrun stops the
//   whole job; it hands mpirun SIGUSR1, which mpirun forwards to every rank without a kill deadline, and
//   waits for the job's own stop (Note [Elastic restarts]).
//
// Note [The stop record]: what a launcher exits with does not say how the ranks ended once the signal that
// stops them reached the launcher too. Open MPI 4.1's mpirun exits 1 after a SIGTERM of its own, and 205
// ("lost communication with a remote daemon") when a SIGTERM ends one of its daemons, which under Slurm run
// as a job step and so are signalled with the steps (`scancel --signal=TERM`), whatever its ranks returned:
// on the Slurm test cluster the ranks had stopped and published their final checkpoint both times. So the run
// says it stopped in a file beside its checkpoints, written by rank 0 right after the final checkpoint is
// published (before --export-weights, which can take seconds a kill deadline may not leave): DIR/stopped,
// "step_N\nstopped by SIGTERM after step N\n", whole or not at all (write_file_durably). A job script removes
// it before each start, and where the launcher's exit is neither 0 nor 75 takes the run as stopped when it
// is there and names the checkpoint DIR/latest names (examples/slurm/train.sbatch, docs/slurm.md). srun is
// the other case: it answers a SIGTERM of its own by SIGKILLing its tasks at once, so no final checkpoint
// is written and there is no record.
//
// Note [Stop signals off the GEMM threads]: a handled signal must never interrupt a thread that is inside one
// of oneDNN's f32 GEMM kernels. Those kernels (jit_avx512_common_gemm_f32 and jit_avx_gemm_f32, oneDNN 2.6
// as Debian 12 ships it) point rsp into a heap buffer while they run, so the kernel writes the signal's frame
// into the heap: "corrupted size vs. prev_size" at the next free, a second later (oneDNN issue 4845, fixed by
// its PR 4855 in 2026). The stop test sending SIGINT mid-step aborted in 3 runs of 10 on a 2-core Xeon, and
// 2 ms apart signals of a no-op handler aborted every run within seconds; with --cpu-gemm openblas none did.
// So once MPI is up, the stop signals are blocked in the main thread, before it starts OpenMP's threads (and
// in any that a parallel region already started), and every thread started later inherits the mask: the
// loader's, the save's, oneDNN's. One thread of our own takes them with sigwait() and runs on_stop(). Being
// an ordinary thread, it prints through the console lock (Note [One console]): a write(2) from it, with no
// lock, once landed between the bar's wipe and its redraw and left the stop line glued to the bar. A thread
// started before (MPI's, CUDA's) keeps them unblocked; the handler there hands the signal on to the stop
// thread (pthread_kill is async-signal-safe). The HDF5 probe sets its own mask (h5_probe.cpp).
#include "dist/train/stop.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "dist/comm/signal_text.h"
#include "dist/train/flags.h"
#include "io/checkpoint/checkpoint_layout.h"
#include "io/log/train_log.h"

namespace cz::train {
namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGUSR1};

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_announce = 0;
dist::SignalSafeText<1024> g_latest;  // the newest published checkpoint, for the second signal's message

const char* short_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

// The stop's line, composed without allocating: a handler composes it too.
class StopLine {
 public:
  StopLine& operator<<(const char* part) {
    for (; *part && n_ + 1 < sizeof text_; ++part) text_[n_++] = *part;
    text_[n_] = '\0';
    return *this;
  }
  const char* c_str() const { return text_; }

 private:
  char text_[1280] = {};
  size_t n_ = 0;
};

StopLine stop_line(int sig, bool again) {
  StopLine line;
  line << "convnext_zero: " << short_name(sig);
  if (!again && sig == SIGUSR1)
    return line << ": stopping after this step (SIGINT or SIGTERM stops it at once)\n";
  if (!again) return line << ": stopping after this step (send it again to stop at once)\n";
  line << " again: stopping now without saving; ";
  const char* latest = g_latest.get();
  if (!latest[0]) return line << "no checkpoint of this run is on disk\n";
  return line << "the newest checkpoint on disk is " << latest << "\n";
}

// Records a stop signal and, on rank 0, says so; a second SIGINT or SIGTERM exits at once, a second SIGUSR1
// is the same request relayed (Note [Stopping on request]). `in_handler`: called from the signal handler,
// where only write(2) may print, so the line can meet a bar being drawn; the stop thread prints through the
// console lock instead (Note [One console]), which keeps it off the bar's line.
void on_stop(int sig, bool in_handler) {
  if (g_signal != 0 && sig == SIGUSR1) return;
  const bool again = g_signal != 0;
  if (!again) g_signal = sig;
  if (g_announce) {
    const StopLine line = stop_line(sig, again);
    if (in_handler) {
      if (progress_bar_drawn()) dist::write_stderr("\n");
      dist::write_stderr(line.c_str());
    } else if (again) {
      console_print_last(line.c_str());
    } else {
      console_print(stderr, line.c_str());
    }
  }
  if (again) _exit(128 + sig);
}

// The thread that takes the stop signals, once it runs (take_stop_signals_off_compute_threads).
std::atomic<bool> g_stop_thread_runs{false};
std::atomic<pthread_t> g_stop_thread{};

// The handler, for a thread that still takes stop signals (one MPI started) or a signal before the stop
// thread runs: it hands the signal to the stop thread, which has it blocked and so finds it in sigwait.
void on_stop_signal(int sig) {
  if (g_stop_thread_runs.load()) {
    pthread_kill(g_stop_thread.load(), sig);
    return;
  }
  on_stop(sig, /*in_handler=*/true);
}

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals) sigaddset(&set, sig);
  return set;
}

}  // namespace

void install_stop_handlers(bool announce) {
  g_announce = announce ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in progress carry on
  for (int sig : kStopSignals) sigaction(sig, &sa, nullptr);
}

void take_stop_signals_off_compute_threads() {
  static std::once_flag started;
  const sigset_t stops = stop_set();
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
  // Threads of a pool that an earlier parallel region started do not inherit the mask; a team of the
  // configured size reaches every one the step will use (none, in convnext_zero: this runs first).
#pragma omp parallel
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
  std::call_once(started, [] {
    std::thread taker([] {
      const sigset_t wanted = stop_set();
      for (;;) {
        int sig = 0;
        if (sigwait(&wanted, &sig) == 0) on_stop(sig, /*in_handler=*/false);
      }
    });
    g_stop_thread.store(taker.native_handle());
    g_stop_thread_runs.store(true);
    taker.detach();
  });
}

int stop_signal() {
  return g_signal;
}

void set_latest_checkpoint(const std::string& path) {
  g_latest.set(path);
}

std::string signal_name(int sig) {
  if (sig == kStopJobEnd) return "the job's end time (--end-margin)";
  return sig == SIGINT || sig == SIGTERM || sig == SIGUSR1 ? short_name(sig) : fmt::format("signal {}", sig);
}

void write_stop_record(const std::string& checkpoint_dir, const std::string& checkpoint, int sig,
                       int64_t last_step) {
  if (checkpoint.empty()) return;
  const std::string name = std::filesystem::path(ckpt::detail::trim_slashes(checkpoint)).filename().string();
  try {
    ckpt::detail::write_file_durably(
        checkpoint_dir, kStopRecordName,
        fmt::format("{}\nstopped by {} after step {}\n", name, signal_name(sig), last_step));
  } catch (const std::exception& e) {
    console_print(stderr,
                  fmt::format("convnext_zero: note: the stop record was not written: {}\n", e.what()));
  }
}

StepBoundary::StepBoundary(dist::ProcessGroup control, double end_margin)
    : control_(std::move(control)), end_margin_(end_margin) {}

void StepBoundary::step_took(double seconds) {
  longest_step_s_ = std::max(longest_step_s_, seconds);
}

// Note [Stopping on request], at the step boundary: every rank contributes its stop signal and whether its
// part of the save in flight is written; all see all, so all take the same decisions. A save is published at
// the first boundary after its last rank file (and rank 0's index) is durable, not at the next save.
//
// Note [Stopping before the job's end]: with --end-margin M in a Slurm job, rank 0 compares the clock with
// the job's end time T at each boundary: when the next step, as long as the slowest so far, would end after
// T - M, the run stops here as on SIGUSR1 (final checkpoint, exit 75), leaving M seconds for the final save
// and the job script's requeue. Rank 0 alone decides, so the ranks' clocks need not agree; the exchange below
// tells the others.
StepBoundary::Agreement StepBoundary::agree(int64_t step, bool unwritten) {
  int mine = stop_signal();
  if (mine == 0 && job_end_time_ && end_margin_ > 0) {
    const double now = double(std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count()) /
                       1000;
    const double left = double(*job_end_time_) - now;
    if (left - longest_step_s_ < end_margin_) {
      mine = kStopJobEnd;
      console_print(stderr,
                    fmt::format("convnext_zero: the job ends in {:.0f} s: stopping after step {} with "
                                "a final checkpoint ({} {})\n",
                                left, step, flag_name(&TrainConfig::end_margin), end_margin_));
    }
  }
  std::vector<double> all = {double(mine), unwritten ? 1.0 : 0.0};
  all = control_.all_gather(all);  // Note [Control communicator]
  Agreement a;
  for (size_t r = 0; r < all.size(); r += 2) {
    if (a.signal == 0) a.signal = int(all[r]);
    a.written = a.written && all[r + 1] == 0;
  }
  return a;
}

}  // namespace cz::train
