// The elastic supervisor behind apps/czrun: runs a training command under mpirun over a hostfile and, when
// the job fails, finds the hosts that still answer and relaunches on them from the newest published
// checkpoint at the same global batch, until the run is done or --max-restarts is spent.
//
// Note [Elastic restarts]: one attempt is one mpirun. It ends in one of four ways:
//   - exit 0: done;
//   - the supervisor was asked to stop (SIGTERM/SIGINT): it sent mpirun SIGUSR1, which mpirun passes to every
//     rank without a deadline, so the ranks stop after the same step and publish a checkpoint (Note [Stopping
//     on request]); exit 75;
//   - a failure the job noticed: a dead rank (its daemon reports it, about a second), a stalled one or a host
//     cut off (the survivors' --comm-timeout, then MPI_Abort), or a daemon whose TCP connection to mpirun
//     stops answering (Open MPI's oob keepalive, which the supervisor sets to --daemon-timeout; by default
//     300 + 9 x 20 s). Open MPI 4.1's mpirun can wait for good for a lost host's daemon while tearing the job
//     down (on the bed, a host's link down and no keepalive: 118 s and counting), so once a rank has printed
//     "aborting" or mpirun has said it lost a daemon, mpirun gets --teardown-grace seconds to exit and is
//     then killed with its process group (its rsh agents; the daemons put themselves in the background, and a
//     survivor's ends its ranks when mpirun's connection closes; a rank whose abort reaches nobody ends
//     itself: Note [Abort without a launcher]);
//   - a launch that logs no step within --start-timeout is killed the same way: a daemon started on a host
//     whose link went down as the launch began never calls back, and nothing reports it;
//   - mpirun exits non-zero by itself.
// After a failure every host (with --readmit, also the ones dropped before) is probed by launching `true`
// on it through mpirun with the same options: an end-to-end check that a daemon starts there and calls back
// over the network, which a host whose link is down or whose namespace is gone fails. Hosts that fail are
// dropped; half-written checkpoint folders are removed; the job is relaunched on the hosts left at the
// size Note [Same global batch at any size] picks, with --resume naming the newest published checkpoint
// (never a half-written one: a checkpoint is published by a rename, Note [Resuming]). Each attempt logs to
// a file of its own; its step records up to the checkpoint resumed from are copied to the command's --log,
// followed by the supervisor's events, so the log reads as one run with each step once.
#pragma once

#include <string>
#include <vector>

#include "dist/elastic/hostfile.h"

namespace cz::elastic {

struct SupervisorOptions {
  std::string hostfile;
  std::vector<Host> hosts;  // used when `hostfile` is empty: the nodes of a Slurm allocation (czrun)
  std::vector<std::string> mpirun = {"mpirun"};  // the launcher and its options (no -np, no hostfile)
  // Inside a Slurm job: launch with srun (`mpirun` then holds srun and its options) over `hosts`, one step
  // per attempt, and probe a node with a one-task step (Note [czrun with srun] in supervisor.cpp).
  bool srun = false;
  std::vector<std::string> command;  // the training command (convnext_zero and its flags)
  int min_ranks = 1;
  int max_restarts = 3;
  bool readmit = false;          // probe dropped hosts again at each restart, and take back those that answer
  double probe_timeout_s = 10;   // a host that has not run `true` by then is lost
  double teardown_grace_s = 10;  // after a rank's abort: how long mpirun may take to exit before it is killed
  double start_timeout_s = 300;  // a launch with no step logged by then has failed (a daemon never started)
  int daemon_timeout_s = 10;     // Open MPI's oob keepalive: idle time + probes x interval; 0: leave it alone
  std::string work_dir;          // attempt logs and hostfiles; default CHECKPOINT_DIR/czrun
  // czrun's own words before the command ("czrun", "--hostfile", "h", "--"): a stop prints them, the command
  // and --resume CHECKPOINT_DIR as the command that resumes (Note [Resume command]); empty: no such line.
  std::vector<std::string> self;
};

// Exit codes: 0 done, 75 stopped on request (resumable), 1 gave up or failed (the reason is printed).
int supervise(const SupervisorOptions& options);

// Lines the supervisor acts on, from the ranks (die(): "...; aborting") and from mpirun (a lost daemon).
bool is_failure_line(const std::string& line);

}  // namespace cz::elastic
