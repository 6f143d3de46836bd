// Failure-handling check (driven by run_fault_test.sh): every rank joins a warm-up all-reduce, then the last
// rank either never joins the next one (`hang`) or kills itself in the middle of it (`kill`). The others must
// fail with a message naming the collective, its size and the ranks, and abort the job, within the timeout.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "dist/comm/bootstrap.h"
#include "dist/comm/communicator.h"

int main(int argc, char** argv) {
  using namespace cz::dist;
  if (argc < 2 || (std::strcmp(argv[1], "hang") != 0 && std::strcmp(argv[1], "kill") != 0)) {
    std::fprintf(stderr, "usage: comm_fault hang|kill [timeout_s]\n");
    return 2;
  }
  const bool kill_mode = std::strcmp(argv[1], "kill") == 0;
  const double timeout = argc > 2 ? std::atof(argv[2]) : 3.0;
  try {
    World& world = World::init(&argc, &argv);
    CommOptions o;
    o.algorithm = Algorithm::ring;
    o.timeout_s = timeout;
    auto comm = make_communicator(world, o);
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
