// Note [A rank's CPUs on a node] in cpu_share.h.
#include "tensor/cpu_share.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>

#include <fmt/format.h>

namespace cz {
namespace {

std::string plural(int n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

bool contains(const std::vector<int>& sorted, int cpu) {
  return std::binary_search(sorted.begin(), sorted.end(), cpu);
}

// One group: CPUs held by exactly `holders`, as whole cores (siblings together), in CPU order.
struct Group {
  std::vector<int> holders;
  std::vector<std::vector<int>> cores;
};

std::vector<Group> group_cpus(const std::vector<RankCpus>& ranks, const CoreOf& core_of) {
  std::map<int, std::vector<int>> holders;  // CPU -> ranks whose masks hold it
  for (size_t r = 0; r < ranks.size(); ++r)
    for (int cpu : ranks[r].mask) holders[cpu].push_back(int(r));
  // Groups in the order of their first CPU; a core's CPUs join the group of its first CPU's holders only
  // when they have the same holders (siblings split by a mask stay apart).
  std::vector<Group> groups;
  std::map<std::vector<int>, size_t> index;
  std::map<std::pair<size_t, int>, size_t> core_slot;  // (group, core) -> position in group.cores
  for (const auto& [cpu, who] : holders) {
    auto [it, added] = index.emplace(who, groups.size());
    if (added) groups.push_back({who, {}});
    Group& g = groups[it->second];
    const auto c = core_of.find(cpu);
    const int core = c == core_of.end() ? cpu : c->second;
    auto [slot, fresh] = core_slot.emplace(std::make_pair(it->second, core), g.cores.size());
    if (fresh) g.cores.emplace_back();
    g.cores[slot->second].push_back(cpu);
  }
  return groups;
}

}  // namespace

std::vector<CpuShare> share_node_cpus(const std::vector<RankCpus>& ranks, const CoreOf& core_of) {
  std::vector<CpuShare> out(ranks.size());
  std::vector<std::vector<int>> near(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    near[r] = ranks[r].near;
    std::sort(near[r].begin(), near[r].end());
  }
  for (const Group& g : group_cpus(ranks, core_of)) {
    const int h = int(g.holders.size()), n = int(g.cores.size());
    if (n < h) {
      // Fewer cores than ranks: each takes one in turn, shared with the others.
      for (int i = 0; i < h; ++i) {
        CpuShare& s = out[size_t(g.holders[size_t(i)])];
        const std::vector<int>& core = g.cores[size_t(i % n)];
        s.cpus.insert(s.cpus.end(), core.begin(), core.end());
        s.crowded = true;
      }
      continue;
    }
    std::vector<int> quota(static_cast<size_t>(h));
    for (int i = 0; i < h; ++i) quota[size_t(i)] = n / h + (i < n % h ? 1 : 0);
    std::vector<int> owner(static_cast<size_t>(n), -1);
    const auto all_near = [&](int r, const std::vector<int>& core) {
      return !near[size_t(r)].empty() &&
             std::all_of(core.begin(), core.end(), [&](int c) { return contains(near[size_t(r)], c); });
    };
    // First the cores near each holder's GPU, then what is left in CPU order.
    for (int pass = 0; pass < 2; ++pass)
      for (int i = 0; i < h; ++i) {
        const int r = g.holders[size_t(i)];
        for (int k = 0; k < n && quota[size_t(i)] > 0; ++k) {
          if (owner[size_t(k)] >= 0 || (pass == 0 && !all_near(r, g.cores[size_t(k)]))) continue;
          owner[size_t(k)] = r;
          --quota[size_t(i)];
        }
      }
    for (int k = 0; k < n; ++k) {
      CpuShare& s = out[size_t(owner[size_t(k)])];
      s.cpus.insert(s.cpus.end(), g.cores[size_t(k)].begin(), g.cores[size_t(k)].end());
    }
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    CpuShare& s = out[r];
    std::sort(s.cpus.begin(), s.cpus.end());
    std::set<int> cores;
    for (int cpu : s.cpus) {
      const auto c = core_of.find(cpu);
      cores.insert(c == core_of.end() ? cpu : c->second);
      if (contains(near[r], cpu)) ++s.near;
    }
    s.cores = int(cores.size());
    std::vector<int> mask = ranks[r].mask;
    std::sort(mask.begin(), mask.end());
    s.holders = 0;
    for (const RankCpus& other : ranks)
      if (std::any_of(other.mask.begin(), other.mask.end(), [&](int c) { return contains(mask, c); }))
        ++s.holders;
    s.holders = std::max(1, s.holders);
  }
  return out;
}

ThreadCpus thread_cpus(const CpuShare& share, const std::vector<int>& near) {
  if (share.cpus.empty()) return {};
  std::vector<int> sorted_near = near;
  std::sort(sorted_near.begin(), sorted_near.end());
  const auto first_near =
      std::find_if(share.cpus.begin(), share.cpus.end(), [&](int c) { return contains(sorted_near, c); });
  ThreadCpus t;
  t.launcher = first_near != share.cpus.end() ? *first_near : share.cpus.front();
  if (share.cpus.size() < 2 || share.crowded) return t;
  for (int cpu : share.cpus)
    if (cpu != t.launcher) t.loaders.push_back(cpu);
  return t;
}

CpuShare estimate_share(const std::vector<int>& mask, int local_ranks, int online_cpus,
                        const CoreOf& core_of) {
  const int local = std::max(1, local_ranks), online = std::max<int>(int(mask.size()), online_cpus);
  const int holders = std::clamp(
      int(std::lround(double(local) * double(mask.size()) / double(std::max(1, online)))), 1, local);
  CpuShare s = share_node_cpus(std::vector<RankCpus>(size_t(holders), RankCpus{mask, {}}), core_of).front();
  s.holders = holders;
  return s;
}

std::string describe_node_shares(const std::vector<RankCpus>& ranks, const std::vector<CpuShare>& shares) {
  std::string out;
  for (size_t r = 0; r < ranks.size() && r < shares.size(); ++r) {
    const CpuShare& s = shares[r];
    std::string why;
    if (s.holders <= 1)
      why = "its mask is its own";
    else if (s.crowded)
      why = fmt::format("its mask is shared by {} with fewer cores than ranks: CPUs shared, nothing pinned",
                        plural(s.holders, "rank"));
    else
      why = fmt::format("its mask is shared by {}: split by cores", plural(s.holders, "rank"));
    out += fmt::format("{}local rank {}: mask {} -> {} ({}, {}{}; {})", out.empty() ? "" : "; ", r,
                       cpu_list(ranks[r].mask), cpu_list(s.cpus), plural(int(s.cpus.size()), "CPU"),
                       plural(s.cores, "core"),
                       ranks[r].near.empty() ? "" : fmt::format(", {} near its GPU", s.near), why);
  }
  return out;
}

std::vector<int> parse_cpu_list(const std::string& list) {
  std::vector<int> cpus;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    const size_t dash = item.find('-');
    char* tail = nullptr;
    const long lo = std::strtol(item.c_str(), &tail, 10);
    long hi = lo;
    if (dash != std::string::npos) hi = std::strtol(item.c_str() + dash + 1, &tail, 10);
    if (tail == item.c_str() || lo < 0 || hi < lo || hi - lo > (1 << 16)) return {};
    for (long c = lo; c <= hi; ++c) cpus.push_back(int(c));
    pos = end + 1;
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += fmt::format("{}{}", out.empty() ? "" : ",",
                       j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

CoreOf read_core_of(const std::vector<int>& cpus, const std::string& root) {
  std::string base = root;
  if (base.empty()) {
    const char* env = std::getenv("CZ_SYSFS_ROOT");
    base = env && *env ? env : "/sys";
  }
  CoreOf core_of;
  for (int cpu : cpus) {
    std::ifstream f(fmt::format("{}/devices/system/cpu/cpu{}/topology/thread_siblings_list", base, cpu));
    std::string line;
    if (!f || !std::getline(f, line)) continue;
    const std::vector<int> siblings = parse_cpu_list(line);
    if (!siblings.empty()) core_of[cpu] = siblings.front();
  }
  return core_of;
}

}  // namespace cz
