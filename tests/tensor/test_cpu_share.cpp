// Note [A rank's CPUs on a node]: the rule over a table of launcher placements on a dual-socket 8-GPU node
// (2 x 28 cores, 2 threads a core: CPUs 0-27 and 56-83 on socket 0, 28-55 and 84-111 on socket 1, CPU c's
// sibling c + 56; GPUs 0-3 on socket 0, 4-7 on socket 1, local rank i driving GPU i), and its sysfs readers.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>

#include "tensor/cpu_share.h"
#include "tensor/omp_wait_policy.h"

namespace cz {
namespace {

std::vector<int> range(int first, int count) {
  std::vector<int> v;
  for (int c = first; c < first + count; ++c) v.push_back(c);
  return v;
}
std::vector<int> join(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  return a;
}

// The node: cores of `first`..`first + count - 1` with their siblings.
std::vector<int> cores(int first, int count) {
  return join(range(first, count), range(first + 56, count));
}
const std::vector<int> kSocket0 = cores(0, 28), kSocket1 = cores(28, 28), kAll = join(kSocket0, kSocket1);
CoreOf node_cores() {
  CoreOf core_of;
  for (int c = 0; c < 56; ++c) core_of[c] = core_of[c + 56] = c;
  return core_of;
}
std::vector<int> gpu_near(int gpu) {
  return gpu < 4 ? kSocket0 : kSocket1;
}

// 8 ranks, rank i's mask from `mask_of`, its GPU's CPUs (GPU i) as `near`.
template <class F>
std::vector<RankCpus> eight(F mask_of) {
  std::vector<RankCpus> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back({mask_of(r), gpu_near(r)});
  return ranks;
}

// What every placement must give: shares inside the masks, disjoint unless crowded, SMT siblings together,
// and a CUDA rank's loader threads = its CPUs less the launching thread's.
void expect_sound(const std::vector<RankCpus>& ranks, const std::vector<CpuShare>& shares) {
  ASSERT_EQ(shares.size(), ranks.size());
  std::set<int> taken;
  const CoreOf core_of = node_cores();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const CpuShare& s = shares[r];
    for (int c : s.cpus) {
      EXPECT_TRUE(std::binary_search(ranks[r].mask.begin(), ranks[r].mask.end(), c))
          << "rank " << r << " CPU " << c;
      const int sibling = c < 56 ? c + 56 : c - 56;
      if (std::binary_search(ranks[r].mask.begin(), ranks[r].mask.end(), sibling))
        EXPECT_TRUE(std::binary_search(s.cpus.begin(), s.cpus.end(), sibling))
            << "rank " << r << " CPU " << c;
      if (!s.crowded) EXPECT_TRUE(taken.insert(c).second) << "CPU " << c << " given twice";
    }
    CpuThreadsRequest req;
    req.cuda = true;
    req.share = s;
    req.gathered = true;
    const CpuThreads t = decide_cpu_threads(req);
    if (!s.crowded && s.cpus.size() > 1) {
      EXPECT_EQ(t.loader_threads, int(s.cpus.size()) - 1) << "rank " << r;
      const ThreadCpus where = thread_cpus(s, ranks[r].near);
      EXPECT_EQ(where.loaders.size(), s.cpus.size() - 1);
      EXPECT_EQ(std::count(where.loaders.begin(), where.loaders.end(), where.launcher), 0);
    }
  }
}

TEST(CpuShare, SrunCpusPerTaskKeepsEachTasksCpus) {
  // srun --ntasks-per-node=8 --cpus-per-task=14 with task/affinity: 7 cores (14 CPUs) a task, its own.
  const auto ranks = eight([](int r) { return cores(7 * r, 7); });
  const auto shares = share_node_cpus(ranks, node_cores());
  expect_sound(ranks, shares);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(shares[size_t(r)].cpus, ranks[size_t(r)].mask) << r;  // not 14 / 8 (issue 51)
    EXPECT_EQ(shares[size_t(r)].cores, 7);
    EXPECT_EQ(shares[size_t(r)].holders, 1);
    EXPECT_FALSE(shares[size_t(r)].crowded);
    EXPECT_EQ(shares[size_t(r)].near, 14);
  }
}

TEST(CpuShare, MpirunPeBindingKeepsEachRanksCpus) {
  // mpirun --map-by ppr:4:socket:PE=7 --bind-to core, ranks mapped by slot: ranks 0-3 on socket 0.
  const auto ranks = eight([](int r) { return cores(7 * r, 7); });
  // The same masks as srun's; --map-by ppr:8:node:PE=1 (one core each, both its threads):
  const auto one = eight([](int r) { return cores(r, 1); });
  const auto shares = share_node_cpus(one, node_cores());
  expect_sound(one, shares);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(shares[size_t(r)].cpus, std::vector<int>({r, r + 56}));
    EXPECT_EQ(shares[size_t(r)].cores, 1);
  }
  expect_sound(ranks, share_node_cpus(ranks, node_cores()));
}

TEST(CpuShare, BindToSocketSplitsEachSocketAmongItsRanks) {
  // Open MPI's default for more than two ranks: bound to a socket, mapped round robin (rank r on socket
  // r % 2). Each socket's 56 CPUs go to its 4 ranks: 7 cores each, where the old rule gave 56 / 8 = 7 CPUs.
  const auto ranks = eight([](int r) { return r % 2 == 0 ? kSocket0 : kSocket1; });
  const auto shares = share_node_cpus(ranks, node_cores());
  expect_sound(ranks, shares);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(shares[size_t(r)].cpus.size(), 14u) << r;
    EXPECT_EQ(shares[size_t(r)].holders, 4);
  }
  // Rank 1 drives GPU 1 (socket 0) but is bound to socket 1: nothing near its GPU; rank 5 is near.
  EXPECT_EQ(shares[1].near, 0);
  EXPECT_EQ(shares[5].near, 14);
  // Its launching thread then takes its share's first CPU; rank 0's is on its GPU's socket.
  EXPECT_EQ(thread_cpus(shares[1], ranks[1].near).launcher, shares[1].cpus.front());
  EXPECT_EQ(thread_cpus(shares[0], ranks[0].near).launcher, 0);
}

TEST(CpuShare, UnboundRanksTakeCoresNearTheirGpu) {
  // --bind-to none (or a job step without task binding): every rank holds all 112 CPUs.
  const auto ranks = eight([](int) { return kAll; });
  const auto shares = share_node_cpus(ranks, node_cores());
  expect_sound(ranks, shares);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(shares[size_t(r)].cores, 7) << r;
    EXPECT_EQ(shares[size_t(r)].near, 14) << r;  // all on its GPU's socket
    EXPECT_EQ(shares[size_t(r)].holders, 8);
  }
  EXPECT_EQ(shares[0].cpus, cores(0, 7));
  EXPECT_EQ(shares[4].cpus, cores(28, 7));
  // Without GPUs (CPU ranks): slices in CPU order, whole cores.
  std::vector<RankCpus> cpu_ranks(8, RankCpus{kAll, {}});
  const auto plain = share_node_cpus(cpu_ranks, node_cores());
  expect_sound(cpu_ranks, plain);
  EXPECT_EQ(plain[1].cpus, cores(7, 7));
}

TEST(CpuShare, MasksSmallerThanTheRankCountAreCrowded) {
  // 8 ranks in a cgroup of 2 cores (4 CPUs): each takes a core in turn, shared, nothing pinned.
  const auto ranks = eight([](int) { return cores(0, 2); });
  const auto shares = share_node_cpus(ranks, node_cores());
  expect_sound(ranks, shares);
  for (int r = 0; r < 8; ++r) {
    EXPECT_TRUE(shares[size_t(r)].crowded);
    EXPECT_EQ(shares[size_t(r)].cores, 1);
    EXPECT_EQ(shares[size_t(r)].cpus, cores(r % 2, 1));
    EXPECT_TRUE(thread_cpus(shares[size_t(r)], ranks[size_t(r)].near).loaders.empty());
  }
  CpuThreadsRequest req;
  req.cuda = true;
  req.share = shares[3];
  EXPECT_EQ(decide_cpu_threads(req).loader_threads, 1);
}

TEST(CpuShare, UnequalAndOverlappingMasks) {
  // Rank 0 holds 0-7, rank 1 4-11 (no SMT): the four CPUs they share are split, the rest are each one's.
  const std::vector<RankCpus> ranks = {{range(0, 8), {}}, {range(4, 8), {}}};
  const auto shares = share_node_cpus(ranks);
  EXPECT_EQ(shares[0].cpus, range(0, 6));
  EXPECT_EQ(shares[1].cpus, range(6, 6));
  EXPECT_EQ(shares[0].holders, 2);
  // A bound rank beside two unbound ones: CPUs 0-3 held by all three (2, 1, 1 cores), 4-15 by two (6, 6).
  const std::vector<RankCpus> mixed = {{range(0, 16), {}}, {range(0, 16), {}}, {range(0, 4), {}}};
  const auto m = share_node_cpus(mixed);
  EXPECT_EQ(m[0].cpus, join(range(0, 2), range(4, 6)));
  EXPECT_EQ(m[1].cpus, join(range(2, 1), range(10, 6)));
  EXPECT_EQ(m[2].cpus, range(3, 1));
  // A rank alone on the node keeps its whole mask, holes and all (a cgroup's cpuset).
  const auto alone = share_node_cpus({{{0, 2, 4, 6}, {}}});
  EXPECT_EQ(alone[0].cpus, std::vector<int>({0, 2, 4, 6}));
  EXPECT_EQ(alone[0].holders, 1);
}

TEST(CpuShare, EstimateBeforeTheMasksAreGathered) {
  // Unbound: all ranks hold the mask.
  EXPECT_EQ(estimate_share(range(0, 16), 4, 16).cpus, range(0, 4));
  EXPECT_EQ(estimate_share(range(0, 16), 4, 16).holders, 4);
  // Bound to an equal slice each: its own.
  EXPECT_EQ(estimate_share(range(14, 14), 8, 112).cpus.size(), 14u);
  EXPECT_EQ(estimate_share(range(14, 14), 8, 112).holders, 1);
  // Bound to a socket of two, 8 ranks: 4 share it.
  EXPECT_EQ(estimate_share(kSocket1, 8, 112, node_cores()).cores, 7);
  // Fewer CPUs than ranks: crowded.
  EXPECT_TRUE(estimate_share(range(0, 2), 4, 2).crowded);
}

TEST(CpuShare, HeaderNamesEachRanksMaskShareAndWhy) {
  const std::vector<RankCpus> ranks = {{range(0, 4), range(0, 2)}, {range(0, 4), range(2, 2)}};
  EXPECT_EQ(describe_node_shares(ranks, share_node_cpus(ranks)),
            "local rank 0: mask 0-3 -> 0-1 (2 CPUs, 2 cores, 2 near its GPU; its mask is shared by 2 ranks: "
            "split by cores); local rank 1: mask 0-3 -> 2-3 (2 CPUs, 2 cores, 2 near its GPU; its mask is "
            "shared by 2 ranks: split by cores)");
  const std::vector<RankCpus> own = {{{5}, {}}};
  EXPECT_EQ(describe_node_shares(own, share_node_cpus(own)),
            "local rank 0: mask 5 -> 5 (1 CPU, 1 core; its mask is its own)");
}

TEST(CpuShare, CpuListsAndSysfsSiblings) {
  EXPECT_EQ(parse_cpu_list("0-3,8-9,5"), std::vector<int>({0, 1, 2, 3, 5, 8, 9}));
  EXPECT_TRUE(parse_cpu_list("").empty());
  EXPECT_TRUE(parse_cpu_list("x").empty());
  EXPECT_EQ(cpu_list({0, 1, 2, 3, 5, 8, 9}), "0-3,5,8-9");
  // A fake sysfs tree: CPUs 0-3, siblings (0, 2) and (1, 3).
  const std::filesystem::path root = std::filesystem::temp_directory_path() / "cz_cpu_share_sysfs";
  std::filesystem::remove_all(root);
  for (int c = 0; c < 4; ++c) {
    const auto dir = root / fmt::format("devices/system/cpu/cpu{}/topology", c);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "thread_siblings_list") << (c % 2 == 0 ? "0,2\n" : "1,3\n");
  }
  const CoreOf core_of = read_core_of(range(0, 5), root.string());
  EXPECT_EQ(core_of, (CoreOf{{0, 0}, {1, 1}, {2, 0}, {3, 1}}));  // CPU 4 unreadable: a core of its own
  const auto shares = share_node_cpus({{range(0, 4), {}}, {range(0, 4), {}}}, core_of);
  EXPECT_EQ(shares[0].cpus, std::vector<int>({0, 2}));
  EXPECT_EQ(shares[1].cpus, std::vector<int>({1, 3}));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace cz
