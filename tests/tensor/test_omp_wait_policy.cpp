// The OpenMP wait policy rule (Note [Choosing the OpenMP wait policy]): active only where every thread of the
// host's ranks has an idle core of the mask to spin on; and the idle-core measurement it rests on. A CUDA
// rank's threads (Note [CPU threads on a CUDA rank]): OpenMP small and passive, the loaders on all cores but
// the launching thread's, the user's settings winning, and the header's words.
#include <gtest/gtest.h>
#include <sched.h>

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

std::vector<int> cpus(int first, int count) {
  std::vector<int> v;
  for (int c = first; c < first + count; ++c) v.push_back(c);
  return v;
}

// A rank of `local_ranks` on a host whose `mask_cores` CPUs all of them hold (unbound): its share as the
// gathered masks give it.
CpuThreadsRequest rank_of(bool cuda, int mask_cores, int local_ranks, int local_rank = 0) {
  CpuThreadsRequest r;
  r.cuda = cuda;
  r.mask_cores = mask_cores;
  r.local_ranks = local_ranks;
  r.share = share_node_cpus(std::vector<RankCpus>(size_t(local_ranks), RankCpus{cpus(0, mask_cores), {}}))
                .at(size_t(local_rank));
  r.gathered = true;
  return r;
}
CpuThreadsRequest cuda_rank(int mask_cores, int local_ranks) {
  return rank_of(true, mask_cores, local_ranks);
}

TEST(CpuThreads, CudaRankLeavesTheLauncherACoreAndWaitsPassively) {
  // The H200 host: 16 cores, one rank.
  const CpuThreads t = decide_cpu_threads(cuda_rank(16, 1));
  EXPECT_EQ(t.cores, 16);
  EXPECT_EQ(t.omp_threads, 1);
  EXPECT_EQ(t.wait.policy, "passive");
  EXPECT_HAS(t.wait.reason, "starve the thread that launches kernels");
  EXPECT_EQ(t.loader_threads, 15);
  EXPECT_TRUE(t.keep_launcher_core);
  // Several unbound ranks per host (mpirun --bind-to none): each rank's split, 16 CPUs / 4 ranks = 4.
  const CpuThreads four = decide_cpu_threads(cuda_rank(16, 4));
  EXPECT_EQ(four.cores, 4);
  EXPECT_EQ(four.loader_threads, 3);
  EXPECT_EQ(four.omp_threads, 1);
  EXPECT_HAS(four.wait.reason, "1 thread per rank waits passively");
  // One CPU per rank: nothing to leave; the loader still gets a thread.
  const CpuThreads one = decide_cpu_threads(cuda_rank(8, 8));
  EXPECT_EQ(one.loader_threads, 1);
  EXPECT_FALSE(one.keep_launcher_core);
  // Fewer CPUs than ranks (crowded): one loader thread, nothing kept.
  const CpuThreads crowded = decide_cpu_threads(cuda_rank(2, 4));
  EXPECT_EQ(crowded.loader_threads, 1);
  EXPECT_FALSE(crowded.keep_launcher_core);
  // The optimizer offloaded to the host: OpenMP gets the CPUs the loaders get (still passive).
  CpuThreadsRequest off = cuda_rank(16, 2);
  off.offload = true;
  EXPECT_EQ(decide_cpu_threads(off).omp_threads, 7);
  EXPECT_EQ(decide_cpu_threads(off).wait.policy, "passive");
}

TEST(CpuThreads, TheUsersSettingsWinOnACudaRank) {
  CpuThreadsRequest r = cuda_rank(16, 1);
  r.loader_threads_flag = 4;
  r.omp_threads_env = 8;
  r.wait_policy_env = "active";
  const CpuThreads t = decide_cpu_threads(r);
  EXPECT_EQ(t.loader_threads, 4);
  EXPECT_EQ(t.omp_threads, 8);
  EXPECT_EQ(t.wait.policy, "active");
  EXPECT_HAS(t.wait.reason, "OMP_WAIT_POLICY is set in the environment");
  r.loader_threads_flag = 0;  // decode on the calling thread
  EXPECT_EQ(decide_cpu_threads(r).loader_threads, 0);
}

TEST(CpuThreads, CpuRankKeepsTheCpuRule) {
  CpuThreadsRequest r = rank_of(false, 8, 2);
  r.idle_cores = 8;
  const CpuThreads t = decide_cpu_threads(r);
  EXPECT_EQ(t.omp_threads, 4);
  EXPECT_EQ(t.loader_threads, 4);
  EXPECT_FALSE(t.keep_launcher_core);
  EXPECT_EQ(t.wait.policy, decide_omp_wait_policy(4, 2, 8, 8).policy);
  r.idle_cores = 2;
  EXPECT_EQ(decide_cpu_threads(r).wait.policy, "passive");
  // After the re-exec the measurement is not repeated: the choice made before it stands.
  r.idle_cores = -1;
  r.wait_chosen = {"active", "4 threads per rank x 2 ranks sharing the mask fit the 8.0 idle cores"};
  EXPECT_EQ(decide_cpu_threads(r).wait.policy, "active");
  EXPECT_HAS(describe_cpu_threads(r, decide_cpu_threads(r)), "OpenMP 4 threads waiting actively");
  // A rank bound to 4 CPUs of its own among 2 ranks: all 4, not 4 / 2 (issue 51).
  CpuThreadsRequest bound = rank_of(false, 4, 1);
  bound.local_ranks = 2;
  bound.idle_cores = 4;
  EXPECT_EQ(decide_cpu_threads(bound).omp_threads, 4);
  EXPECT_EQ(decide_cpu_threads(bound).wait.policy, "active");
  // SMT: a thread per CPU of the share (siblings are kept together by the split, not left idle).
  CpuThreadsRequest smt = rank_of(false, 4, 1);
  smt.share = share_node_cpus({{cpus(0, 4), {}}, {cpus(0, 4), {}}}, {{0, 0}, {1, 1}, {2, 0}, {3, 1}}).front();
  EXPECT_EQ(smt.share.cpus, std::vector<int>({0, 2}));
  EXPECT_EQ(decide_cpu_threads(smt).omp_threads, 2);
}

TEST(CpuThreads, TheHeaderSaysWhatEachPoolGotAndWhatWasOverridden) {
  const CpuThreadsRequest r = cuda_rank(16, 1);
  EXPECT_EQ(describe_cpu_threads(r, decide_cpu_threads(r), thread_cpus(r.share, {})),
            "CPU threads per rank (a CUDA rank, 16 CPUs, 16 cores: its own; 16 in the mask, 1 rank on this "
            "host): 15 loader threads on CPUs 1-15, CPU 0 left to the thread that launches kernels; OpenMP 1 "
            "thread (the step's math is on the GPU) waiting passively");
  CpuThreadsRequest o = cuda_rank(16, 4);
  o.loader_threads_flag = 2;
  o.omp_threads_env = 3;
  o.wait_policy_env = "active";
  EXPECT_EQ(
      describe_cpu_threads(o, decide_cpu_threads(o)),
      "CPU threads per rank (a CUDA rank, 4 CPUs, 4 cores: its split of a mask 4 ranks share; 16 in the "
      "mask, 4 ranks on this host): 2 loader threads (--loader-threads 2), one of the 4 CPUs left to the "
      "thread that launches kernels; OpenMP 3 threads (OMP_NUM_THREADS=3) waiting actively "
      "(OMP_WAIT_POLICY=active)");
  CpuThreadsRequest cpu = rank_of(false, 2, 1);
  cpu.idle_cores = 0;
  EXPECT_EQ(describe_cpu_threads(cpu, decide_cpu_threads(cpu)),
            "CPU threads per rank (2 CPUs, 2 cores: its own; 2 in the mask, 1 rank on this host): 2 loader "
            "threads; OpenMP 2 threads waiting passively");
  CpuThreadsRequest crowded = rank_of(false, 2, 4, 3);
  EXPECT_HAS(describe_cpu_threads(crowded, decide_cpu_threads(crowded)),
             "(1 CPU, 1 core: shared, 4 ranks' masks meeting its own with fewer cores than ranks; 2 in the "
             "mask, 4 ranks on this host)");
}

TEST(CpuThreads, PinningAThreadNarrowsItsMaskOnly) {
  const std::vector<int> mask = affinity_cpus();
  ASSERT_EQ(int(mask.size()), available_cores());
  std::vector<int> seen;
  bool pinned = false;
  std::thread t([&] {
    pinned = pin_current_thread({mask.back()});
    seen = affinity_cpus();
  });
  t.join();
  EXPECT_TRUE(pinned);
  EXPECT_EQ(seen, std::vector<int>({mask.back()}));
  EXPECT_EQ(affinity_cpus(), mask);  // the calling thread's mask is untouched
  EXPECT_FALSE(pin_current_thread({}));
  EXPECT_EQ(affinity_cpus(), mask);
}

}  // namespace
}  // namespace cz
