// Choosing OMP_WAIT_POLICY at start: Note [Choosing the OpenMP wait policy] in omp_wait_policy.h.
#include "tensor/omp_wait_policy.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "tensor/parallel.h"

namespace cz {
namespace {

constexpr const char* kChoiceVar = "CZ_OMP_WAIT_CHOICE";  // "<policy>|<reason>", set for the re-exec

std::string& note() {
  static std::string n;
  return n;
}

struct CpuTimes {
  unsigned long long idle = 0, total = 0;
};

// cpuN lines of /proc/stat: user nice system idle iowait irq softirq steal (guest time is inside user).
std::map<int, CpuTimes> read_cpu_times() {
  std::map<int, CpuTimes> times;
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    fields >> cpu;
    unsigned long long v[8] = {};
    for (unsigned long long& x : v) fields >> x;
    CpuTimes& t = times[cpu];
    t.idle = v[3] + v[4];
    for (unsigned long long x : v) t.total += x;
  }
  return times;
}

std::string plural(int n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

}  // namespace

OmpWaitChoice decide_omp_wait_policy(int threads, int ranks_sharing, int mask_cores, double idle_cores) {
  const int need = threads * ranks_sharing;
  const std::string who = fmt::format("{} per rank x {} sharing the mask", plural(threads, "thread"),
                                      plural(ranks_sharing, "rank"));
  if (threads <= 1)
    return {"passive", fmt::format("{}: no thread waits for another, so spinning would gain nothing", who)};
  if (need > mask_cores)
    return {"passive",
            fmt::format("{} oversubscribe the {} this rank may use", who, plural(mask_cores, "core"))};
  if (idle_cores < 0) return {"passive", fmt::format("{}, but /proc/stat could not be read", who)};
  if (idle_cores + kIdleSlack >= double(need))
    return {"active", fmt::format("{} fit the {:.1f} idle cores of the {} cores this rank may use", who,
                                  idle_cores, mask_cores)};
  return {"passive", fmt::format("{} but only {:.1f} of the {} cores this rank may use were idle at start "
                                 "(spinning beside other work stalls)",
                                 who, idle_cores, mask_cores)};
}

double idle_cores_in_mask(double seconds) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  const std::map<int, CpuTimes> before = read_cpu_times();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const std::map<int, CpuTimes> after = read_cpu_times();
  if (before.empty() || after.empty()) return -1;
  double idle = 0;
  for (const auto& [cpu, a] : after) {
    const auto b = before.find(cpu);
    if (b == before.end() || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set)) continue;
    const unsigned long long total = a.total - b->second.total;
    // No tick counted on this CPU in the window: it was idle (a tickless idle CPU may not advance them).
    idle += total == 0 ? 1.0 : double(a.idle - b->second.idle) / double(total);
  }
  return idle;
}

int launcher_local_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) return std::atoi(v);
  return 1;
}

CpuThreads decide_cpu_threads(const CpuThreadsRequest& r) {
  CpuThreads t;
  const int holders = std::max(1, r.share.holders);
  const std::string env_reason = "OMP_WAIT_POLICY is set in the environment";
  if (!r.cuda) {
    t.cores = std::max(1, int(r.share.cpus.size()));
    t.omp_threads = r.omp_threads_env > 0 ? r.omp_threads_env : t.cores;
    t.loader_threads = r.loader_threads_flag >= 0 ? r.loader_threads_flag : t.cores;
    t.wait = !r.wait_policy_env.empty() ? OmpWaitChoice{r.wait_policy_env, env_reason}
             : !r.wait_chosen.policy.empty()
                 ? r.wait_chosen
                 : decide_omp_wait_policy(t.omp_threads, holders, r.mask_cores, r.idle_cores);
    return t;
  }
  // Note [CPU threads on a CUDA rank].
  t.cores = std::max(1, int(r.share.cpus.size()));
  t.keep_launcher_core = t.cores > 1 && !r.share.crowded;
  const int spare = t.keep_launcher_core ? t.cores - 1 : 1;
  t.omp_threads = r.omp_threads_env > 0 ? r.omp_threads_env : r.offload ? spare : 1;
  t.loader_threads = r.loader_threads_flag >= 0 ? r.loader_threads_flag : spare;
  if (!r.wait_policy_env.empty()) {
    t.wait = {
        r.wait_policy_env,
        r.wait_policy_env == "active"
            ? env_reason + " (on a CUDA rank spinning threads can starve the thread that launches kernels)"
            : env_reason};
  } else {
    t.wait = {"passive",
              fmt::format("a CUDA rank: {} per rank waits passively, since spinning ones starve the thread "
                          "that launches kernels",
                          plural(t.omp_threads, "thread"))};
  }
  return t;
}

std::string describe_cpu_threads(const CpuThreadsRequest& r, const CpuThreads& t, const ThreadCpus& cpus) {
  const CpuShare& s = r.share;
  const std::string own =
      s.crowded
          ? fmt::format("shared, {} ranks' masks meeting its own with fewer cores than ranks", s.holders)
      : s.holders <= 1 ? "its own"
                       : fmt::format("its split of a mask {} ranks share", s.holders);
  std::string out = fmt::format("CPU threads per rank ({}{}, {}: {}{}; {} in the mask, {} on this host): ",
                                r.cuda ? "a CUDA rank, " : "", plural(int(s.cpus.size()), "CPU"),
                                plural(s.cores, "core"), own, r.gathered ? "" : ", estimated", r.mask_cores,
                                plural(std::max(1, r.local_ranks), "rank"));
  out += plural(t.loader_threads, "loader thread");
  if (r.loader_threads_flag >= 0) out += fmt::format(" (--loader-threads {})", r.loader_threads_flag);
  if (r.cuda) {
    if (!cpus.loaders.empty())
      out += fmt::format(" on CPU{} {}, CPU {} left to the thread that launches kernels",
                         cpus.loaders.size() == 1 ? "" : "s", cpu_list(cpus.loaders), cpus.launcher);
    else if (t.keep_launcher_core)
      out += fmt::format(", one of the {} CPUs left to the thread that launches kernels", t.cores);
    else
      out += ", sharing a CPU with the thread that launches kernels";
  }
  out += fmt::format(
      "; OpenMP {}{} waiting {}", plural(t.omp_threads, "thread"),
      r.omp_threads_env > 0 ? fmt::format(" (OMP_NUM_THREADS={})", r.omp_threads_env)
      : r.cuda ? (r.offload ? " (the host runs the offloaded optimizer)" : " (the step's math is on the GPU)")
               : "",
      t.wait.policy == "active" ? "actively" : "passively");
  if (!r.wait_policy_env.empty()) out += fmt::format(" (OMP_WAIT_POLICY={})", r.wait_policy_env);
  return out;
}

CpuThreadsRequest cpu_threads_request(bool cuda, bool offload, int loader_threads_flag, int local_ranks) {
  CpuThreadsRequest r;
  r.cuda = cuda;
  r.offload = offload;
  const std::vector<int> mask = affinity_cpus();
  r.mask_cores = int(mask.size());
  r.local_ranks = local_ranks;
  r.share = estimate_share(mask, local_ranks, int(sysconf(_SC_NPROCESSORS_ONLN)), read_core_of(mask));
  r.loader_threads_flag = loader_threads_flag;
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && std::atoi(env) > 0)
    r.omp_threads_env = std::atoi(env);
  // OMP_WAIT_POLICY as the user set it: the value our own re-exec set (kChoiceVar says so) is not theirs.
  if (const char* set = std::getenv("OMP_WAIT_POLICY")) {
    const char* ours = std::getenv(kChoiceVar);
    const std::string choice = ours ? ours : "";
    const size_t bar = choice.find('|');
    if (bar == std::string::npos || choice.substr(0, bar) != set)
      r.wait_policy_env = set;
    else
      r.wait_chosen = {choice.substr(0, bar), choice.substr(bar + 1)};
  }
  return r;
}

void choose_omp_wait_policy(char** argv, bool cuda, bool offload) {
  const CpuThreadsRequest req = cpu_threads_request(cuda, offload, -1, launcher_local_ranks());
  // In the process that goes on (this one when nothing re-executes, else the re-executed one).
  if (cuda && req.omp_threads_env == 0) set_omp_threads_per_rank(decide_cpu_threads(req).omp_threads);
  if (const char* set = std::getenv("OMP_WAIT_POLICY")) {
    const char* ours = std::getenv(kChoiceVar);
    const std::string choice = ours ? ours : "";
    const size_t bar = choice.find('|');
    if (bar != std::string::npos && choice.substr(0, bar) == set)
      note() = fmt::format("{}: {}", set, choice.substr(bar + 1));
    else
      note() = fmt::format("{}: OMP_WAIT_POLICY is set in the environment", set);
    return;
  }
  OmpWaitChoice c;
  if (cuda) {
    c = decide_cpu_threads(req).wait;  // nothing to measure: passive
  } else {
    const int sharing = std::max(1, req.share.holders);
    int threads =
        std::max(1, int(req.share.cpus.size()));  // as configure_cpu_threads will, unless the estimate is off
    if (req.omp_threads_env > 0) threads = req.omp_threads_env;
    // Measured only where the answer depends on it: one thread per rank, or too many, decide without it.
    const bool measure = threads > 1 && threads * sharing <= req.mask_cores;
    const double idle = measure ? idle_cores_in_mask(kIdleSampleSeconds) : -1;
    c = decide_omp_wait_policy(threads, sharing, req.mask_cores, idle);
  }
  setenv("OMP_WAIT_POLICY", c.policy.c_str(), 1);
  setenv(kChoiceVar, (c.policy + "|" + c.reason).c_str(), 1);
  execv("/proc/self/exe", argv);
  // Still here: libgomp keeps the policy it read at start (its default).
  note() = fmt::format("libgomp's default: re-executing with OMP_WAIT_POLICY={} failed ({})", c.policy,
                       std::strerror(errno));
  unsetenv("OMP_WAIT_POLICY");
  unsetenv(kChoiceVar);
}

const std::string& omp_wait_policy_note() {
  return note();
}

}  // namespace cz
