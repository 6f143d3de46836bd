// The Slurm job as a process sees it (dist/comm/slurm.h): the launch read from the environment, slurmctld's
// job line parsed, and each launch check's one line. The same against a real slurmctld: tests/slurm.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "dist/comm/slurm.h"
#include "tensor/check.h"

namespace cz::dist {
namespace {

SlurmProcess process(const std::map<std::string, std::string>& vars) {
  return read_slurm_process([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// A line `scontrol show job -o` printed on the test cluster (scripts/slurm.sh) for
// `sbatch -N2 --ntasks-per-node=2 --gpus-per-node=1 --time=5 --requeue`.
const std::string kJobLine =
    "JobId=6 JobName=czs-j2.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901754 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=00:05:00 TimeMin=N/A SubmitTime=2026-11-27T16:36:50 "
    "EligibleTime=2026-11-27T16:36:50 AccrueTime=2026-11-27T16:36:50 StartTime=2026-11-27T16:36:50 "
    "EndTime=2026-11-27T16:41:50 Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-11-27T16:36:50 Scheduler=Main Partition=czs AllocNode:Sid=localhost:5997 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=4 NumTasks=4 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=4,node=2,billing=4 Socks/Node=* NtasksPerN:B:S:C=2:0:*:* "
    "CoreSpec=* MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/czs-j2.sh WorkDir=/tmp "
    "StdErr=/tmp/czs-j2.out StdIn=/dev/null StdOut=/tmp/czs-j2.out Power= TresPerNode=gres:gpu:1 ";

TEST(Slurm, LaunchFromEnvironment) {
  EXPECT_EQ(process({}).launch, SlurmLaunch::none);
  EXPECT_EQ(process({{"SLURM_JOB_ID", "7"}, {"CZ_IGNORE_SLURM", "1"}}).launch, SlurmLaunch::none);
  // The batch script: no step id.
  const SlurmProcess batch = process({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}});
  EXPECT_EQ(batch.launch, SlurmLaunch::direct);
  EXPECT_EQ(batch.job_id, "7");
  // srun --mpi=pmix, task 3 of 4.
  const SlurmProcess srun = process({{"SLURM_JOB_ID", "7"},
                                     {"SLURM_STEP_ID", "0"},
                                     {"SLURM_STEP_NUM_TASKS", "4"},
                                     {"SLURM_PROCID", "3"},
                                     {"PMIX_RANK", "3"},
                                     {"SLURMD_NODENAME", "n2"}});
  EXPECT_EQ(srun.launch, SlurmLaunch::srun);
  EXPECT_EQ(srun.step_tasks, 4);
  EXPECT_EQ(srun.procid, 3);
  EXPECT_TRUE(srun.pmi);
  EXPECT_EQ(srun.node, "n2");
  // An mpirun rank on another node sees its daemon's srun step too: Open MPI's variables decide.
  const SlurmProcess mpirun = process({{"SLURM_JOB_ID", "7"},
                                       {"SLURM_STEP_ID", "1"},
                                       {"SLURM_STEP_NUM_TASKS", "2"},
                                       {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(mpirun.launch, SlurmLaunch::mpirun);
  const SlurmProcess requeued =
      process({{"SLURM_JOB_ID", "7"}, {"SLURM_RESTART_COUNT", "2"}, {"SLURM_JOB_END_TIME", "1700000000"}});
  EXPECT_EQ(requeued.restart_count, 2);
  ASSERT_TRUE(requeued.end_time);
  EXPECT_EQ(*requeued.end_time, 1700000000);
}

TEST(Slurm, ParsesScontrolJob) {
  const SlurmAllocation a = parse_scontrol_job(kJobLine);
  EXPECT_EQ(a.job_id, "6");
  EXPECT_EQ(a.nodes, 2);
  EXPECT_EQ(a.tasks, 4);
  EXPECT_EQ(a.tasks_per_node, 2);
  EXPECT_EQ(a.gpus_per_node, 1);
  EXPECT_TRUE(a.requeue);
  EXPECT_EQ(a.restarts, 0);
  EXPECT_EQ(a.node_list, "n[1-2]");
  ASSERT_TRUE(a.end_time);
  ASSERT_TRUE(parse_scontrol_job(kJobLine.substr(0, kJobLine.find("EndTime="))).end_time == std::nullopt);
  // Five minutes after StartTime, in whatever time zone this runs.
  std::string start = kJobLine;
  start.replace(start.find("EndTime=2026-11-27T16:41:50"), 27, "EndTime=2026-11-27T16:36:50");
  EXPECT_EQ(*a.end_time - *parse_scontrol_job(start).end_time, 300);

  // Newer Slurm spells the gres with a slash; a typed GPU; no GPUs; no --ntasks-per-node.
  auto with = [](const std::string& from, const std::string& to) {
    std::string s = kJobLine;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  EXPECT_EQ(parse_scontrol_job(with("TresPerNode=gres:gpu:1", "TresPerNode=gres/gpu:8")).gpus_per_node, 8);
  EXPECT_EQ(parse_scontrol_job(with("TresPerNode=gres:gpu:1", "TresPerNode=gres:gpu:a100:4")).gpus_per_node,
            4);
  EXPECT_EQ(parse_scontrol_job(with("TresPerNode=gres:gpu:1", "TresPerNode=gres:nic:1")).gpus_per_node, -1);
  // --gpus-per-task: per task times the node's tasks (--ntasks-per-node, else tasks / nodes).
  EXPECT_EQ(parse_scontrol_job(with("TresPerNode=gres:gpu:1", "TresPerTask=gres:gpu:2")).gpus_per_node, 4);
  EXPECT_EQ(parse_scontrol_job(with("NtasksPerN:B:S:C=2:0", "NtasksPerN:B:S:C=0:0")).tasks_per_node, 0);
  EXPECT_EQ(parse_scontrol_job(with("Restarts=0", "Restarts=3")).restarts, 3);
  EXPECT_THROW(parse_scontrol_job("slurm_load_jobs error: Invalid job id specified"), ValueError);
}

TEST(Slurm, SrunWithoutPmiIsRefused) {
  SlurmProcess p = process({{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}});
  const std::string line = check_srun_launch(p);
  EXPECT_NE(line.find("srun started 2 tasks without a PMI plugin"), std::string::npos) << line;
  EXPECT_NE(line.find("srun --mpi=pmix"), std::string::npos) << line;
  EXPECT_NE(line.find("mpirun"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
  p.pmi = true;
  EXPECT_EQ(check_srun_launch(p), "");
  p.pmi = false;
  p.step_tasks = 1;  // one task is a world of one: nothing to join
  EXPECT_EQ(check_srun_launch(p), "");
  EXPECT_EQ(check_srun_launch(process({{"SLURM_JOB_ID", "7"}, {"OMPI_COMM_WORLD_SIZE", "2"}})), "");
}

TEST(Slurm, AllocationChecks) {
  const SlurmAllocation a = parse_scontrol_job(kJobLine);  // 2 nodes x 2 tasks, 1 GPU per node
  const SlurmProcess mpirun = process({{"SLURM_JOB_ID", "6"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  SlurmRunFacts run;
  run.world = 4;
  run.max_ranks_per_node = 1;
  EXPECT_EQ(check_slurm_allocation(mpirun, a, run), "");

  run.world = 3;  // mpirun -np 3
  std::string line = check_slurm_allocation(mpirun, a, run);
  EXPECT_NE(line.find("mpirun started 3 ranks but job 6 has 4 tasks (2 nodes x 2 --ntasks-per-node)"),
            std::string::npos)
      << line;
  run.supervised = true;  // czrun relaunches on fewer ranks after losing a node
  EXPECT_EQ(check_slurm_allocation(mpirun, a, run), "");
  run.supervised = false;
  run.world = 4;

  run.max_ranks_per_node = 3;  // 4 ranks mapped 3 + 1 onto nodes of 2 tasks each
  line = check_slurm_allocation(mpirun, a, run);
  EXPECT_NE(line.find("3 ranks run on one node but job 6 has --ntasks-per-node 2"), std::string::npos)
      << line;

  run.gpus = true;
  run.max_ranks_per_node = 2;  // 2 ranks on a node with 1 GPU
  line = check_slurm_allocation(mpirun, a, run);
  EXPECT_NE(line.find("2 ranks run on one node but job 6 has 1 GPU per node (--gpus-per-node 1)"),
            std::string::npos)
      << line;
  run.gpus = false;  // CPU ranks need no GPU
  EXPECT_EQ(check_slurm_allocation(mpirun, a, run), "");

  const SlurmProcess direct = process({{"SLURM_JOB_ID", "6"}});
  run.world = 1;
  line = check_slurm_allocation(direct, a, run);
  EXPECT_NE(line.find("the job has 4 tasks but convnext_zero was started once"), std::string::npos) << line;

  // Requeued: without --checkpoint-dir; with one that holds a checkpoint but no --resume; with both.
  const SlurmProcess requeued = process({{"SLURM_JOB_ID", "6"},
                                         {"SLURM_STEP_ID", "0"},
                                         {"SLURM_STEP_NUM_TASKS", "4"},
                                         {"SLURM_RESTART_COUNT", "1"}});
  run.world = 4;
  line = check_slurm_allocation(requeued, a, run);
  EXPECT_NE(line.find("job 6 has been requeued (1 time) but the run has no --checkpoint-dir"),
            std::string::npos)
      << line;
  run.checkpoint_dir = "ck";
  run.checkpoint_on_disk = true;
  line = check_slurm_allocation(requeued, a, run);
  EXPECT_NE(line.find("ck holds a checkpoint, but the run has no --resume"), std::string::npos) << line;
  run.resume = true;
  EXPECT_EQ(check_slurm_allocation(requeued, a, run), "");
  run.resume = false;
  run.checkpoint_on_disk = false;  // requeued before its first checkpoint: starting over is right
  EXPECT_EQ(check_slurm_allocation(requeued, a, run), "");
}

}  // namespace
}  // namespace cz::dist
