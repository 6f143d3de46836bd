// Stop signals never land on a thread that may be running one of oneDNN's GEMMs (Note [Stop signals off the
// GEMM threads] in src/dist/train/stop.cpp), and a stop signal sent to the process still reaches the run.
// Each case runs in a child of its own (a death test in the threadsafe style: the child re-executes this
// program), because the stop thread and the masks last for the life of the process.
#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/train/stop.h"
#include "io/log/train_log.h"
#include "tensor/cpu/gemm_libraries.h"

namespace {

using Clock = std::chrono::steady_clock;

bool stops_blocked_here() {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, SIGINT) == 1 && sigismember(&now, SIGTERM) == 1 && sigismember(&now, SIGUSR1) == 1;
}

bool stop_arrives(int sig) {
  for (const auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    if (cz::train::stop_signal() == sig) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::fflush(stderr);
  _exit(1);
}

// A pool of 4 OpenMP threads started before the call, a thread started after it, the calling thread: all
// block the stop signals; a SIGUSR1 to the process is still recorded.
void masks_then_a_stop() {
  cz::train::install_stop_handlers(false);
  omp_set_num_threads(4);
  int started_unblocked = 0;
#pragma omp parallel reduction(+ : started_unblocked)
  started_unblocked += stops_blocked_here() ? 0 : 1;
  if (started_unblocked != 4) fail("the pool started with the stop signals blocked already");
  cz::train::take_stop_signals_off_compute_threads();
  int blocked = 0, threads = 0;
#pragma omp parallel reduction(+ : blocked, threads)
  {
    blocked += stops_blocked_here() ? 1 : 0;
    threads += 1;
  }
  if (threads != 4 || blocked != 4) fail("an OpenMP thread still takes stop signals");
  if (!stops_blocked_here()) fail("the calling thread still takes stop signals");
  bool later = false;
  std::thread([&] { later = stops_blocked_here(); }).join();
  if (!later) fail("a thread started afterwards takes stop signals");
  ::kill(::getpid(), SIGUSR1);
  if (!stop_arrives(SIGUSR1)) fail("SIGUSR1 was not recorded within 10 s");
  _exit(0);
}

// The failure itself: a stop signal while oneDNN's f32 GEMMs run on every thread, then more GEMMs, each of
// which allocates and frees oneDNN's buffers. Without the stop thread the signal's frame was written into
// oneDNN's heap buffer and the process aborted at a later free ("corrupted size vs. prev_size").
void gemms_through_a_stop() {
  cz::train::install_stop_handlers(false);
  cz::train::take_stop_signals_off_compute_threads();
  constexpr int64_t n = 320;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const auto gemms_for = [&](std::chrono::milliseconds span) {
    for (const auto until = Clock::now() + span; Clock::now() < until;) {
      cz::cpu::sgemm_on(cz::cpu::GemmLibrary::onednn, false, false, n, n, n, 1.0f, a.data(), n, b.data(), n,
                        0.0f, c.data(), n);
      std::vector<float> churn(size_t(1) << 15, 1.0f);  // a free that meets the heap's neighbours
      if (churn[7] != 1.0f) fail("unreachable");
    }
  };
  std::thread sender([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ::kill(::getpid(), SIGUSR1);
  });
  gemms_for(std::chrono::milliseconds(400));
  sender.join();
  if (!stop_arrives(SIGUSR1)) fail("SIGUSR1 was not recorded within 10 s");
  gemms_for(std::chrono::milliseconds(200));
  if (c[0] != 0.5f * 0.25f * float(n)) fail("the GEMM's result is wrong");
  _exit(0);
}

// Rank 0's stop line while the bar is drawn as fast as it can be, its length changing at every drawing (so
// each one wipes the last): the line stands on its own, in no piece of the terminal's output (text between
// '\r' and '\n') that holds a bar. Once the stop thread printed it with write(2) and no lock, its '\n' could
// fall between a wipe and the redraw, and the line went out glued to the bar's end.
void stop_line_off_the_bar(int delay_ms) {
  char path[] = "/tmp/cz_stop_bar_XXXXXX";
  const int console = ::dup(STDERR_FILENO);
  const auto give_up = [&](const char* what) {
    ::dup2(console, STDERR_FILENO);
    fail(what);
  };
  const int fd = ::mkstemp(path);
  if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) give_up("cannot send stderr to a file");
  cz::train::install_stop_handlers(true);
  cz::train::take_stop_signals_off_compute_threads();
  {
    cz::ProgressBar bar(1000000, cz::ProgressMode::bar);
    std::thread sender([delay_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      ::kill(::getpid(), SIGUSR1);
    });
    int64_t step = 0;
    std::optional<Clock::time_point> stopped;
    while (!stopped || Clock::now() < *stopped + std::chrono::milliseconds(20)) {
      ++step;
      bar.update(step, 1.0, 100.0, step % 2 ? 0.9 : 0.0);  // "loader-bound: ..." every other drawing
      if (!stopped && cz::train::stop_signal() != 0) stopped = Clock::now();
    }
    sender.join();
  }
  std::fflush(stderr);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(path);
  int lines = 0;
  std::string piece;
  std::istringstream pieces(text.str());
  while (std::getline(pieces, piece, '\n')) {
    std::istringstream parts(piece);
    for (std::string part; std::getline(parts, part, '\r');) {
      if (part.find("SIGUSR1: stopping after this step") == std::string::npos) continue;
      ++lines;
      if (part.find("ETA") != std::string::npos) give_up("the stop line was printed onto the bar");
    }
  }
  if (lines != 1) give_up("not one stop line");
  _exit(0);
}

}  // namespace

TEST(StopSignals, NoComputeThreadTakesThem) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(masks_then_a_stop(), testing::ExitedWithCode(0), "");
}

TEST(StopSignals, OneDnnGemmsRunThroughAStop) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int run = 0; run < 6; ++run)
    EXPECT_EXIT(gemms_through_a_stop(), testing::ExitedWithCode(0), "") << run;
}

TEST(StopSignals, StopLineNeverLandsOnTheBar) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int run = 0; run < 20; ++run)
    EXPECT_EXIT(stop_line_off_the_bar(5 + 3 * run), testing::ExitedWithCode(0), "") << run;
}
