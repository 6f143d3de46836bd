// `convnext_zero --loader-only`: the input pipeline alone, with the run's data, augmentation and loader
// flags, timed over a number of batches; what DALI's and FFCV's users measure first.
#pragma once

#include <cstdint>
#include <string>

#include "dist/comm/bootstrap.h"
#include "dist/train/config.h"

namespace cz::train {

// Batches each rank reads when neither --steps nor --epochs is given.
inline constexpr int64_t kLoaderOnlyBatches = 50;

struct LoaderOnlyReport {
  int64_t batches = 0;  // per rank: --steps x --grad-accum micro-batches, or --epochs' worth, or the default
  int64_t images = 0;   // all ranks together
  double seconds = 0;   // the slowest rank's, from the loader's start to its last batch
  int threads = 0;      // loader threads per rank (--loader-threads resolved; 0: the calling thread decodes)
  int ranks = 1;
  double img_per_s = 0;             // images / seconds
  double img_per_s_per_thread = 0;  // img_per_s / (ranks x max(threads, 1))
  // The steady state, the fill apart: the batches after each rank's first (whose wait is the pipeline's
  // fill: the workers' start and the first chunks' latency), timed from that first batch on. The consumer
  // takes batches at once, so the workers never wait for room: this is what they make in a second.
  double fill_seconds = 0;  // the slowest rank's wait for its first batch
  int64_t steady_images = 0;
  double steady_seconds = 0;  // the slowest rank's, from its first batch to its last
  double steady_img_per_s = 0;
  double steady_img_per_s_per_thread = 0;
};

// Collective over the world (one host reduction at the end): every rank opens the training set as the run
// would (--eval-split's held-out part stays in: its share is a few percent, its images the same kind), makes
// the run's loader for its share and takes its batches, crossing epochs as training does. The clock starts
// before the loader's workers do, so the pipeline's fill is counted, as it is in a run; the steady state is
// reported beside it (a loader's scaling is its steady state's).
LoaderOnlyReport run_loader_only(TrainConfig cfg, dist::World& world);

// "loader only: 50 batches of 32 x 1 rank(s), 1600 images in 2.010 s: 796.0 img/s, 398.0 img/s per thread (2
// loader threads per rank, folder:/data, 224x224, --augment --aa rand-m9-mstd0.5-inc1)", and with more than
// one batch a second line: "loader only, steady state: 1568 images of the 49 batches after the first (the
// fill, 0.081 s) in 1.929 s: 812.9 img/s, 406.4 img/s per thread".
std::string format_loader_only(const LoaderOnlyReport& r, const TrainConfig& cfg);

}  // namespace cz::train
