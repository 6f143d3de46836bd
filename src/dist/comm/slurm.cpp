// The Slurm job: this process's environment, slurmctld's view of the allocation, and the launch checks.
#include "dist/comm/slurm.h"

#include <mpi.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <regex>
#include <vector>

#include <fmt/format.h>

#include "dist/comm/bootstrap.h"
#include "dist/comm/mpi_util.h"
#include "tensor/check.h"

namespace cz::dist {
namespace {

std::string get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v ? std::string(v) : std::string();
}

int get_int(const EnvLookup& env, const char* name, int fallback) {
  const std::string v = get(env, name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  return end && *end == '\0' ? int(n) : fallback;
}

// "2026-11-27T16:41:50" in local time, as scontrol writes times; none for "Unknown", "None", "N/A".
std::optional<int64_t> parse_slurm_time(const std::string& s) {
  std::tm tm{};
  const char* end = strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end || *end != '\0') return std::nullopt;
  tm.tm_isdst = -1;
  const std::time_t t = std::mktime(&tm);
  if (t == std::time_t(-1)) return std::nullopt;
  return int64_t(t);
}

// The value of " KEY=VALUE" in a `scontrol show job -o` line ("" when absent). Values hold no spaces except
// those of the last fields (Command, WorkDir, ...), which are not read here.
std::string field(const std::string& line, const std::string& key) {
  const std::string needle = key + "=";
  size_t at = 0;
  while ((at = line.find(needle, at)) != std::string::npos) {
    if (at == 0 || line[at - 1] == ' ') {
      const size_t from = at + needle.size();
      return line.substr(from, line.find(' ', from) - from);
    }
    at += needle.size();
  }
  return "";
}

int to_int(const std::string& s, int fallback) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), ::isdigit)) return fallback;
  return std::atoi(s.c_str());
}

}  // namespace

SlurmProcess read_slurm_process(const EnvLookup& env) {
  SlurmProcess p;
  if (get(env, "CZ_IGNORE_SLURM") == "1") return p;  // the checks off, e.g. for a test suite run in a job
  p.job_id = get(env, "SLURM_JOB_ID");
  if (p.job_id.empty()) p.job_id = get(env, "SLURM_JOBID");
  if (p.job_id.empty()) return p;
  p.node = get(env, "SLURMD_NODENAME");
  p.restart_count = get_int(env, "SLURM_RESTART_COUNT", 0);
  p.pmi = !get(env, "PMIX_RANK").empty() || !get(env, "PMI_RANK").empty();
  if (const int end = get_int(env, "SLURM_JOB_END_TIME", 0); end > 0) p.end_time = end;
  // Note [Slurm environments]: Open MPI's variables first, since an mpirun rank on another node also sees
  // the srun step of its daemon; the batch script (the "batch" step) sets no SLURM_STEP_ID.
  if (!get(env, "OMPI_COMM_WORLD_SIZE").empty()) {
    p.launch = SlurmLaunch::mpirun;
  } else if (!get(env, "SLURM_STEP_ID").empty() || !get(env, "SLURM_STEPID").empty()) {
    p.launch = SlurmLaunch::srun;
    p.step_tasks = get_int(env, "SLURM_STEP_NUM_TASKS", get_int(env, "SLURM_NTASKS", 1));
    p.procid = get_int(env, "SLURM_PROCID", 0);
  } else {
    p.launch = SlurmLaunch::direct;
  }
  return p;
}

SlurmProcess read_slurm_process() {
  return read_slurm_process([](const char* name) { return std::getenv(name); });
}

SlurmAllocation parse_scontrol_job(const std::string& line) {
  SlurmAllocation a;
  a.job_id = field(line, "JobId");
  CZ_CHECK(!a.job_id.empty(), "not a job of `scontrol show job -o`: '{}'", line.substr(0, 200));
  a.nodes = to_int(field(line, "NumNodes"), 0);
  a.tasks = to_int(field(line, "NumTasks"), 0);
  // NtasksPerN:B:S:C=2:0:*:*: the first number is --ntasks-per-node, 0 when not given.
  const std::string per = field(line, "NtasksPerN:B:S:C");
  a.tasks_per_node = to_int(per.substr(0, per.find(':')), 0);
  // TresPerNode=gres:gpu:2 (22.05), gres/gpu:2 (23.02 on), gres:gpu:a100:2 with a type; absent without GPUs.
  static const std::regex gpus(R"((?:^|,)gres[:/]gpu(?::[^:,]+)?:(\d+)(?:,|$))");
  std::smatch m;
  const std::string tres = field(line, "TresPerNode");
  if (std::regex_search(tres, m, gpus)) a.gpus_per_node = std::atoi(m[1].str().c_str());
  // --gpus-per-task (examples/slurm/train.sbatch): TresPerTask=gres:gpu:1, times the tasks a node runs (its
  // --ntasks-per-node, else the tasks spread evenly over the nodes).
  const std::string per_task = field(line, "TresPerTask");
  if (a.gpus_per_node < 0 && std::regex_search(per_task, m, gpus)) {
    const int tasks = a.tasks_per_node > 0                                   ? a.tasks_per_node
                      : a.nodes > 0 && a.tasks > 0 && a.tasks % a.nodes == 0 ? a.tasks / a.nodes
                                                                             : 0;
    if (tasks > 0) a.gpus_per_node = std::atoi(m[1].str().c_str()) * tasks;
  }
  a.requeue = field(line, "Requeue") == "1";
  a.restarts = to_int(field(line, "Restarts"), 0);
  a.end_time = parse_slurm_time(field(line, "EndTime"));
  a.node_list = field(line, "NodeList");
  return a;
}

SlurmAllocation query_slurm_allocation(const std::string& job_id) {
  CZ_CHECK(!job_id.empty() && std::all_of(job_id.begin(), job_id.end(),
                                          [](char c) { return std::isdigit(uint8_t(c)) || c == '_'; }),
           "SLURM_JOB_ID '{}' is not a job id", job_id);
  const std::string cmd = fmt::format("scontrol show job -o {} 2>&1", job_id);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  CZ_CHECK_T(CommError, pipe != nullptr, "could not run scontrol: {}", std::strerror(errno));
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  CZ_CHECK_T(CommError, status == 0, "`scontrol show job {}` failed: {}", job_id,
             out.empty() ? fmt::format("exit status {}", WEXITSTATUS(status)) : out);
  return parse_scontrol_job(out.substr(0, out.find('\n')));
}

std::string check_srun_launch(const SlurmProcess& p) {
  if (p.launch != SlurmLaunch::srun || p.pmi || p.step_tasks <= 1) return "";
  return fmt::format(
      "srun started {} tasks without a PMI plugin (srun --mpi=none, slurm.conf's MpiDefault), so MPI cannot "
      "join them into one job: launch with `srun --mpi=pmix ...` (`srun --mpi=list` shows the plugins), or "
      "with `mpirun` inside the allocation (sbatch or salloc; it reads the allocation, no hostfile)",
      p.step_tasks);
}

std::string check_slurm_allocation(const SlurmProcess& p, const SlurmAllocation& a,
                                   const SlurmRunFacts& run) {
  // A requeued job that would start over, or run past its checkpoint's steps twice (Note [Requeue]).
  if (p.restart_count > 0 || a.restarts > 0) {
    const int n = std::max(p.restart_count, a.restarts);
    if (run.checkpoint_dir.empty())
      return fmt::format(
          "job {} has been requeued ({} time{}) but the run has no --checkpoint-dir, so it would start over "
          "from step 1: give --checkpoint-dir DIR, and --resume DIR in the job script once DIR/latest exists "
          "(examples/slurm/train.sbatch)",
          a.job_id, n, n == 1 ? "" : "s");
    if (run.checkpoint_on_disk && !run.resume)
      return fmt::format(
          "job {} has been requeued ({} time{}) and {} holds a checkpoint, but the run has no --resume, so "
          "it would start over from step 1: add --resume {} (examples/slurm/train.sbatch adds it when "
          "{}/latest exists)",
          a.job_id, n, n == 1 ? "" : "s", run.checkpoint_dir, run.checkpoint_dir, run.checkpoint_dir);
  }
  if (p.launch == SlurmLaunch::direct && a.tasks > 1 && run.world == 1)
    return fmt::format(
        "the job has {} tasks but convnext_zero was started once, by the job script itself: launch it with "
        "`srun --mpi=pmix convnext_zero ...` or `mpirun convnext_zero ...` (both start one rank per task)",
        a.tasks);
  if (p.launch == SlurmLaunch::mpirun && !run.supervised && a.tasks > 0 && run.world != a.tasks)
    return fmt::format(
        "mpirun started {} rank{} but job {} has {} tasks ({} node{} x {}): leave -np out (mpirun then "
        "starts "
        "one rank per task) or give -np {}, or ask sbatch for {} task{}",
        run.world, run.world == 1 ? "" : "s", a.job_id, a.tasks, a.nodes, a.nodes == 1 ? "" : "s",
        a.tasks_per_node > 0 ? fmt::format("{} --ntasks-per-node", a.tasks_per_node)
                             : fmt::format("{} tasks", a.tasks),
        a.tasks, run.world, run.world == 1 ? "" : "s");
  if (a.tasks_per_node > 0 && run.max_ranks_per_node > a.tasks_per_node)
    return fmt::format(
        "{} ranks run on one node but job {} has --ntasks-per-node {}: launch one rank per task (mpirun "
        "without "
        "--map-by or --oversubscribe, or srun), or ask for --ntasks-per-node {}",
        run.max_ranks_per_node, a.job_id, a.tasks_per_node, run.max_ranks_per_node);
  if (run.gpus && a.gpus_per_node >= 0 && run.max_ranks_per_node > a.gpus_per_node)
    return fmt::format(
        "{} ranks run on one node but job {} has {} GPU{} per node (--gpus-per-node {}): each rank drives "
        "one GPU, so ask for --ntasks-per-node {} or --gpus-per-node {}",
        run.max_ranks_per_node, a.job_id, a.gpus_per_node, a.gpus_per_node == 1 ? "" : "s", a.gpus_per_node,
        a.gpus_per_node, run.max_ranks_per_node);
  return "";
}

std::string check_slurm_job(const World& world, SlurmRunFacts run,
                            const std::optional<SlurmAllocation>& allocation) {
  const SlurmProcess p = read_slurm_process();
  run.world = world.size();
  // Every rank's node, by Slurm's name for it (host names need not differ: Note [One-host cluster] in
  // scripts/slurm.sh), counted for the most ranks on one node.
  constexpr int kLen = 128;
  std::vector<char> mine(kLen, '\0'), all(size_t(kLen) * size_t(world.size()));
  const std::string node = p.node.empty() ? world.hostname() : p.node;
  std::memcpy(mine.data(), node.data(), std::min<size_t>(node.size(), kLen - 1));
  CZ_MPI(MPI_Allgather(mine.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, world.comm()));
  std::map<std::string, int> per_node;
  for (int r = 0; r < world.size(); ++r) ++per_node[std::string(all.data() + size_t(r) * kLen)];
  for (const auto& [name, n] : per_node) run.max_ranks_per_node = std::max(run.max_ranks_per_node, n);
  // Rank 0's verdict for all: the allocation was read by rank 0 alone.
  std::string verdict;
  if (world.rank() == 0 && allocation) verdict = check_slurm_allocation(p, *allocation, run);
  int len = int(verdict.size());
  CZ_MPI(MPI_Bcast(&len, 1, MPI_INT, 0, world.comm()));
  verdict.resize(size_t(len));
  if (len > 0) CZ_MPI(MPI_Bcast(verdict.data(), len, MPI_CHAR, 0, world.comm()));
  return verdict;
}

std::optional<int64_t> slurm_job_end_time(const SlurmProcess& p, const std::optional<SlurmAllocation>& a) {
  if (p.end_time) return p.end_time;
  if (a) return a->end_time;
  return std::nullopt;
}

}  // namespace cz::dist
