// The checkpoint, log and progress entries of the flag table (flags.h).
#include "dist/train/flags_table.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dist/comm/mesh.h"
#include "dist/train/recipe.h"
#include "dist/train/step_tracer.h"
#include "dist/zero/schedule.h"
#include "tensor/check.h"

namespace cz::train {

std::vector<Flag> output_flags() {
  using C = const TrainConfig&;
  using F = const Flag&;
  using T = TrainConfig;
  return {
      {.name = "--export-weights",
       .field = &T::export_weights,
       .group = kOutputGroup,
       .help = "write the trained weights (HDF5, timm keys)"},
      {.name = "--checkpoint-dir",
       .field = &T::checkpoint_dir,
       .group = kOutputGroup,
       .help = "write sharded HDF5 checkpoints (DIR/step_N, DIR/latest) here, one at the end of the run too"},
      {.name = "--checkpoint-every",
       .field = &T::checkpoint_every,
       .group = kOutputGroup,
       .help = "steps between checkpoints (0: only at the end)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.checkpoint_every >= 0, "{} must be >= 0, got {}", f.name, c.checkpoint_every);
             CZ_CHECK(c.checkpoint_every == 0 || !c.checkpoint_dir.empty(), "{} needs {}", f.name,
                      flag_name(&T::checkpoint_dir));
           }},
      {.name = "--keep-checkpoints",
       .field = &T::keep_checkpoints,
       .group = kOutputGroup,
       .help =
           "keep the newest K complete checkpoints (older ones removed once a newer one is complete; 0: all)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.keep_checkpoints >= 0, "{} must be >= 0, got {}", f.name, c.keep_checkpoints);
           }},
      {.name = "--end-margin",
       .field = &T::end_margin,
       .group = kOutputGroup,
       .help = "in a Slurm job: stop after the step that ends less than SECONDS before the job's end time "
               "(SLURM_JOB_END_TIME, else slurmctld's), save a final checkpoint and exit 75, as on SIGUSR1, "
               "so that a job script can requeue it (docs/slurm.md); 0: off",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.end_margin >= 0, "{} must be >= 0 seconds (0: off), got {}", f.name, c.end_margin);
             CZ_CHECK(c.end_margin == 0 || !c.checkpoint_dir.empty(),
                      "{} needs {}: the stop before the job's end saves a checkpoint to resume from", f.name,
                      flag_name(&T::checkpoint_dir));
           }},
      {.name = "--keep-best",
       .field = &T::keep_best,
       .group = kOutputGroup,
       .help = "also keep the checkpoint of the best eval top-1 in DIR/best (and of the EMA's in "
               "DIR/best_ema), apart from --keep-checkpoints' rotation",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.keep_best || !c.checkpoint_dir.empty(), "{} needs {}", f.name,
                      flag_name(&T::checkpoint_dir));
           }},
      {.name = "--checkpoint-sync",
       .field = &T::checkpoint_sync,
       .group = kOutputGroup,
       .help =
           "publish each --checkpoint-every checkpoint before the next step (the step waits for the "
           "write) instead of in the background, so that a failure loses at most --checkpoint-every steps",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.checkpoint_sync || c.checkpoint_every > 0, "{} needs {}", f.name,
                      flag_name(&T::checkpoint_every));
           }},
      {.name = "--resume",
       .field = &T::resume,
       .group = kOutputGroup,
       .help = "continue from a checkpoint: DIR (its latest complete one) or DIR/step_N, at any world size "
               "and stage"},
      {.name = "--log",
       .field = &T::log,
       .group = kOutputGroup,
       .help =
           "JSON-lines log: a start record, then one object per step and per evaluation; --resume continues "
           "it (records past the checkpoint dropped), else an existing one is kept as FILE.1"},
      {.name = "--tensorboard",
       .field = &T::tensorboard,
       .group = kOutputGroup,
       .help =
           "write the log's scalars (loss, lr, grad norm, img/s, communication, memory, eval top-1/top-5) "
           "as TensorBoard event files into DIR, on rank 0: tensorboard --logdir DIR"},
      {.name = "--comms-table",
       .field = &T::comms_table,
       .group = kOutputGroup,
       .help = "at the end, print rank 0's collectives per kind and message size (count, time, algorithm and "
               "bus bandwidth in nccl-tests' units, exposed time) and write them into --log"},
      {.name = "--trace",
       .field = &T::trace,
       .group = kOutputGroup,
       .help = "write a timeline of the steps in --trace-steps to FILE (Chrome Trace Event JSON, one process "
               "per rank: ops, collectives, data wait, optimizer, checkpoint saves); open it in "
               "https://ui.perfetto.dev or chrome://tracing (docs/training.md)"},
      {.name = "--trace-steps",
       .field = &T::trace_steps,
       .group = kOutputGroup,
       .help = "A:B, the first and last step (1-based, inclusive) that --trace records",
       .check = [](C c, F f) { parse_trace_steps(c.trace_steps, f.name); },
       .ranks_agree = true},
      {.name = "--no-progress",
       .field = &T::progress,
       .group = kOutputGroup,
       .help = "no progress on stderr (by default a bar on a terminal, else a plain line every "
               "--progress-interval seconds)",
       .inverted = true},
      {.name = "--rank-stats-every",
       .field = &T::rank_stats_every,
       .group = kOutputGroup,
       .help = "every N steps gather every rank's step time, compute, data wait, input copies and waits in "
               "collectives, and name the slowest rank and its phase in the log (0: off; one rank: off)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.rank_stats_every >= 0, "{} must be a number of steps >= 0, got {}", f.name,
                      c.rank_stats_every);
           },
       .ranks_agree = true},
      {.name = "--progress-interval",
       .field = &T::progress_interval_s,
       .group = kOutputGroup,
       .help = "seconds between plain progress lines when stderr is not a terminal (mpirun, a file)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.progress_interval_s) && c.progress_interval_s >= 0,
                      "{} must be a number of seconds >= 0, got {}", f.name, c.progress_interval_s);
           }},
  };
}

}  // namespace cz::train
