// The OpenMP wait policy rule (Note [Choosing the OpenMP wait policy]): active only where every thread of the
// host's ranks has an idle core of the mask to spin on; and the idle-core measurement it rests on.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

#include "tensor/omp_wait_policy.h"
#include "tensor/parallel.h"

namespace cz {
namespace {

// EXPECT_THAT(..., HasSubstr(...)) without gmock, which this test program does not link.
#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(OmpWaitPolicy, ActiveOnlyWhereTheThreadsFitIdleCores) {
  // The case: one process of 2 threads on 2 idle cores spins.
  EXPECT_EQ(decide_omp_wait_policy(2, 1, 2, 1.98).policy, "active");
  EXPECT_HAS(decide_omp_wait_policy(2, 1, 2, 1.98).reason, "fit the 2.0 idle cores of the 2");
  EXPECT_EQ(decide_omp_wait_policy(2, 1, 2, 2 - kIdleSlack).policy, "active");  // a sample's noise
  // Beside a compiler (one core busy) or a parallel build (both busy): passive.
  EXPECT_EQ(decide_omp_wait_policy(2, 1, 2, 1.0).policy, "passive");
  EXPECT_HAS(decide_omp_wait_policy(2, 1, 2, 1.0).reason, "only 1.0 of the 2");
  EXPECT_EQ(decide_omp_wait_policy(2, 1, 2, 0.05).policy, "passive");
  // The other ranks on the host count: 2 ranks of 4 threads need 8 idle cores.
  EXPECT_EQ(decide_omp_wait_policy(4, 2, 8, 7.9).policy, "active");
  EXPECT_EQ(decide_omp_wait_policy(4, 2, 8, 6.0).policy, "passive");
  // Oversubscribed (OMP_NUM_THREADS above the cores, or ranks x threads): passive whatever is idle.
  EXPECT_EQ(decide_omp_wait_policy(4, 1, 2, 2.0).policy, "passive");
  EXPECT_HAS(decide_omp_wait_policy(2, 2, 2, 2.0).reason, "oversubscribe the 2 cores");
  // One thread per rank waits for nobody; an unreadable /proc/stat is not a reason to spin.
  EXPECT_EQ(decide_omp_wait_policy(1, 2, 2, 2.0).policy, "passive");
  EXPECT_HAS(decide_omp_wait_policy(1, 2, 2, 2.0).reason, "1 thread per rank x 2 ranks");
  EXPECT_EQ(decide_omp_wait_policy(2, 1, 2, -1).policy, "passive");
}

TEST(OmpWaitPolicy, IdleCoresSeeABusyThread) {
  const double idle = idle_cores_in_mask(0.1);
  ASSERT_GE(idle, 0) << "/proc/stat unreadable";
  EXPECT_LE(idle, double(available_cores()) + 1e-9);
  // A spinning thread of our own takes (nearly) a core from the idle count, however busy the machine is.
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  const double with_spinner = idle_cores_in_mask(0.2);
  stop = true;
  spinner.join();
  EXPECT_LE(with_spinner, double(available_cores()) - 0.7) << "idle before: " << idle;
}

}  // namespace
}  // namespace cz
