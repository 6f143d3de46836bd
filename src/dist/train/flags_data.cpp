// The data and evaluation entries of the flag table (flags.h): sources, splits, batches, the loader.
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

std::vector<Flag> data_flags() {
  using C = const TrainConfig&;
  using F = const Flag&;
  using T = TrainConfig;
  return {
      {.name = "--data",
       .field = &T::data,
       .group = kDataGroup,
       .help = "synthetic[:k=v,...] | h5:FILE | cifar10:DIR | folder:DIR | wds:PATTERN (tar shards, "
               "e.g. wds:/d/train-{000000..000127}.tar)",
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "data"},
      {.name = "--eval-data",
       .field = &T::eval_data,
       .group = kDataGroup,
       .help = "evaluation set (default: the data source's own eval split)"},
      {.name = "--eval-split",
       .field = &T::eval_split,
       .group = kDataGroup,
       .help = "hold out this fraction of --data's examples as the eval set, e.g. 0.05: the same examples of "
               "each class for a given --seed, never trained on (not with --eval-data)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.eval_split) && c.eval_split >= 0 && c.eval_split < 1,
                      "{} must be in [0, 1), got {}", f.name, c.eval_split);
             CZ_CHECK(c.eval_split == 0 || c.eval_data.empty(),
                      "{} holds out part of {} as the eval set, so it does not go with {} {}", f.name,
                      flag_name(&T::data), flag_name(&T::eval_data), c.eval_data);
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "eval_split"},
      {.name = "--eval-every",
       .field = &T::eval_every,
       .group = kDataGroup,
       .help = "evaluate every N steps (0: at the end only)",
       .check = [](C c,
                   F f) { CZ_CHECK(c.eval_every >= 0, "{} must be >= 0, got {}", f.name, c.eval_every); }},
      {.name = "--eval-batches",
       .field = &T::eval_batches,
       .group = kDataGroup,
       .help = "evaluate on at most N batches per rank (0: all)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.eval_batches >= 0, "{} must be >= 0, got {}", f.name, c.eval_batches);
           }},
      {.name = "--seed",
       .field = &T::seed,
       .group = kDataGroup,
       .help = "initialisation, shuffling, augmentation and drop-path",
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "seed"},
      {.name = "--no-shuffle",
       .field = &T::shuffle,
       .group = kDataGroup,
       .help = "read the training set in file order",
       .inverted = true,
       .json_key = "shuffle"},
      {.name = "--loader-threads",
       .field = &T::loader_threads,
       .group = kDataGroup,
       .help = "data loader worker threads (default: the cores this rank has, its affinity mask's CPUs / "
               "the ranks on its host, as for OpenMP; 0: decode on the training thread)",
       .check =
           [](C c, F f) {
             // -1 is the default, resolved by the trainer (DataFeed::DataFeed) and the planner.
             CZ_CHECK(c.loader_threads >= -1, "{} must be >= 0, got {}", f.name, c.loader_threads);
           }},
      {.name = "--skip-bad-samples",
       .field = &T::skip_bad_samples,
       .group = kDataGroup,
       .help = "leave out up to N samples that cannot be used (a wds: sample without its label or with one "
               "out of range, an image that fails to decode: read in its place is the next sample), each "
               "reported (0: the first is an error)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.skip_bad_samples >= 0, "{} must be >= 0, got {}", f.name, c.skip_bad_samples);
           }},
      {.name = "--data-index-dir",
       .field = &T::data_index_dir,
       .group = kDataGroup,
       .help = "wds: folder for the shards' index files (default: beside the shards, else "
               "~/.cache/convnext_zero/wds-index)"},
  };
}

}  // namespace cz::train
