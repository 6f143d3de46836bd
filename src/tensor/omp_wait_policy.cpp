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

OmpWaitChoice decide_omp_wait_policy(int threads, int local_ranks, int mask_cores, double idle_cores) {
  const int need = threads * local_ranks;
  const std::string who =
      fmt::format("{} per rank x {} on this host", plural(threads, "thread"), plural(local_ranks, "rank"));
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

void choose_omp_wait_policy(char** argv) {
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
  const int local = launcher_local_ranks();
  int threads = std::max(1, available_cores() / local);  // as configure_cpu_threads will
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && std::atoi(env) > 0) threads = std::atoi(env);
  // Measured only where the answer depends on it: one thread per rank, or too many, decide without it.
  const bool measure = threads > 1 && threads * local <= available_cores();
  const double idle = measure ? idle_cores_in_mask(kIdleSampleSeconds) : -1;
  const OmpWaitChoice c = decide_omp_wait_policy(threads, local, available_cores(), idle);
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
