// Failure-handling checks, driven by scripts. `hang` and `kill` (run_fault_test.sh): every rank joins a
// warm-up all-reduce, then the last rank either never joins the next one (`hang`) or kills itself in the
// middle of it
// (`kill`); the others must fail with a message naming the collective, its size and the ranks, and abort the
// job, within the timeout. `flood` (run_memory_test.sh, run_stall_test.sh): every rank submits 1 MiB
// all-reduces forever without keeping the handles, as a gradient hook that fires and forgets; Note
// [Back-pressure] must keep its memory flat, and when a rank stalls the others must still fail with the
// message.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "dist/comm/bootstrap.h"
#include "dist/comm/communicator.h"

using namespace cz::dist;

namespace {

[[noreturn]] void flood(Communicator& comm, int rank) {
  const int64_t count = 256 << 10;  // 1 MiB of f32
  std::vector<float> buf(size_t(count), 1.0f);
  int64_t submitted = 0;
  auto next_report = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (;;) {
    WorkHandle w =
        comm.all_reduce(buf.data(), buf.data(), count, cz::DType::f32, cz::Device::cpu(), ReduceOp::avg);
    // A broken communicator fails every call at once: this is where a stalled peer's timeout surfaces.
    if (w->is_completed()) w->wait();
    ++submitted;
    if (rank == 0 && std::chrono::steady_clock::now() >= next_report) {
      std::printf("flood: %lld calls submitted\n", static_cast<long long>(submitted));
      std::fflush(stdout);
      next_report += std::chrono::seconds(1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool known = argc >= 2 && (std::strcmp(argv[1], "hang") == 0 || std::strcmp(argv[1], "kill") == 0 ||
                                   std::strcmp(argv[1], "flood") == 0);
  if (!known) {
    std::fprintf(stderr, "usage: comm_fault hang|kill|flood [timeout_s] [max_in_flight]\n");
    return 2;
  }
  const bool kill_mode = std::strcmp(argv[1], "kill") == 0;
  const double timeout = argc > 2 ? std::atof(argv[2]) : 3.0;
  try {
    World& world = World::init(&argc, &argv);
    CommOptions o;
    o.algorithm = Algorithm::ring;
    o.timeout_s = timeout;
    if (argc > 3) o.max_in_flight = int(std::min(std::atoll(argv[3]), (long long)INT_MAX));
    auto comm = make_communicator(world, o);
    if (std::strcmp(argv[1], "flood") == 0) flood(*comm, world.rank());
    const int64_t count = 16 << 20;  // 64 MiB of f32
    std::vector<float> buf(size_t(count), 1.0f);
    comm->all_reduce(buf.data(), buf.data(), count, cz::DType::f32, cz::Device::cpu(), ReduceOp::sum)->wait();
    const bool victim = world.rank() == world.size() - 1;
    if (victim && !kill_mode) {
      // Never joins; the others' MPI_Abort ends this process.
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout * 20));
      return 0;
    }
    // The victim joins late, so that the others are surely inside the collective, and dies 1 ms into its own
    // part of it (a 64 MiB all-reduce takes several ms here).
    if (victim) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto work =
        comm->all_reduce(buf.data(), buf.data(), count, cz::DType::f32, cz::Device::cpu(), ReduceOp::sum);
    if (victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      raise(SIGKILL);
    }
    work->wait();
    std::fprintf(stderr, "[rank %d] the collective completed although a peer failed\n", world.rank());
    return 3;
  } catch (const std::exception& e) {
    die(e);
  }
}
