// The Slurm job a process runs in: how it was started (srun, mpirun inside the allocation, or directly in the
// batch script), the allocation as slurmctld has it (tasks, tasks and GPUs per node, end time, requeues), and
// the checks of a run's launch against them, each failing with one line that says what to change
// (docs/slurm.md).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace cz::dist {

class World;

// How this process was started. `direct`: in a Slurm job, by neither srun nor mpirun (the batch script ran
// the program itself, as one process).
enum class SlurmLaunch { none, srun, mpirun, direct };

// Note [Slurm environments]: a process reads its own step's environment, which is not always the job's.
// Under srun it is that step's (SLURM_STEP_NUM_TASKS, SLURM_PROCID); an mpirun rank sees the environment of
// whoever started it: mpirun's own (the batch script's) on mpirun's node, and on the other nodes that of Open
// MPI's daemon, which mpirun started with its own `srun --ntasks-per-node=1` step, so SLURM_NTASKS there
// counts daemons. What the job asked for (--ntasks, --ntasks-per-node, --gpus-per-node) therefore comes from
// slurmctld (`scontrol show job`, one query by rank 0), never from a rank's SLURM_* variables.
struct SlurmProcess {
  SlurmLaunch launch = SlurmLaunch::none;
  std::string job_id;     // SLURM_JOB_ID
  std::string node;       // SLURMD_NODENAME: this process's node ("" outside a job)
  int step_tasks = 0;     // srun: SLURM_STEP_NUM_TASKS; 0 otherwise
  int procid = 0;         // srun: SLURM_PROCID
  bool pmi = false;       // a PMI server to start MPI from (PMIX_RANK or PMI_RANK: srun --mpi=pmix|pmi2)
  int restart_count = 0;  // SLURM_RESTART_COUNT: times the job has been requeued
  std::optional<int64_t> end_time;  // SLURM_JOB_END_TIME (Slurm 23.02 on), Unix seconds
};

using EnvLookup = std::function<const char*(const char*)>;
// CZ_IGNORE_SLURM=1: launch `none` whatever Slurm's variables say (no checks, no --end-margin).
SlurmProcess read_slurm_process(const EnvLookup& env);
SlurmProcess read_slurm_process();  // from this process's environment

// The job as slurmctld has it: one line of `scontrol show job -o ID`.
struct SlurmAllocation {
  std::string job_id;
  int nodes = 0, tasks = 0;
  int tasks_per_node = 0;  // --ntasks-per-node; 0 when not given
  int gpus_per_node = -1;  // --gpus-per-node or --gres=gpu:N; -1 when the job asked for no GPUs per node
  bool requeue = false;    // the job may be requeued (--requeue, or JobRequeue=1 in slurm.conf)
  int restarts = 0;        // times it has been requeued
  std::optional<int64_t> end_time;  // EndTime, Unix seconds; none while unknown
  std::string node_list;            // NodeList, as Slurm writes it (n[1-2])
};
// Throws ValueError on a line that is not a job's.
SlurmAllocation parse_scontrol_job(const std::string& line);
// Runs `scontrol show job -o ID`; throws CommError with scontrol's message when it fails.
SlurmAllocation query_slurm_allocation(const std::string& job_id);

// Before MPI starts, on every process: a launch MPI cannot start from, in one line; "" when none. srun
// without a PMI plugin (--mpi=none, the default where slurm.conf has MpiDefault=none) leaves Open MPI no way
// to find its peers: each task would start as a world of one, or fail in MPI_Init with a page of text.
std::string check_srun_launch(const SlurmProcess& p);

// What the allocation checks need to know of the run.
struct SlurmRunFacts {
  int world = 1;               // ranks
  int max_ranks_per_node = 1;  // the most ranks any one node (SLURMD_NODENAME) holds
  bool gpus = false;           // --device cuda
  bool supervised = false;     // under czrun, which launches on fewer ranks after a node is lost
  std::string checkpoint_dir;  // "" when none
  bool resume = false;
  bool checkpoint_on_disk = false;  // checkpoint_dir holds a published checkpoint (DIR/latest)
};
// The run against the allocation, in one line ("" when they agree): mpirun's -np against the job's tasks,
// more ranks on a node than it has GPUs, a requeued job that would start over. Pure, for tests.
std::string check_slurm_allocation(const SlurmProcess& p, const SlurmAllocation& a, const SlurmRunFacts& run);

// Collective over the world: every rank contributes its node, rank 0 checks the run against `allocation`
// (read by rank 0 before MPI started: scontrol is a child process, and Open MPI is happier without forks),
// and all return rank 0's line ("" when they agree, or without an allocation). `run.world` and
// `run.max_ranks_per_node` are filled in here.
std::string check_slurm_job(const World& world, SlurmRunFacts run,
                            const std::optional<SlurmAllocation>& allocation);

// The job's end time, Unix seconds: SLURM_JOB_END_TIME, else slurmctld's EndTime (Slurm before 23.02 does not
// set the variable); none when neither is known.
std::optional<int64_t> slurm_job_end_time(const SlurmProcess& p, const std::optional<SlurmAllocation>& a);

}  // namespace cz::dist
