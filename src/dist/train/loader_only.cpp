// --loader-only: loader_only.h.
#include "dist/train/loader_only.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "dist/train/flags.h"
#include "dist/train/trainer.h"
#include "io/loader.h"
#include "tensor/check.h"
#include "tensor/device.h"
#include "tensor/omp_wait_policy.h"
#include "tensor/parallel.h"

namespace cz::train {

LoaderOnlyReport run_loader_only(TrainConfig cfg, dist::World& world) {
  // --loader-threads' default, as the trainer resolves it (Note [CPU threads on a CUDA rank]).
  cfg.loader_threads = decide_cpu_threads(cpu_threads_request(parse_device(cfg.device).is_cuda(), false,
                                                              cfg.loader_threads, world.local_size()))
                           .loader_threads;
  DatasetOptions dopt;
  dopt.image_size = cfg.image_size;
  const auto data = open_dataset(cfg.data, Split::train, dopt);
  take_data_classes(cfg, *data);  // Mixup's targets are num_classes wide
  const LoaderOptions lo = run_loader_options(cfg, Split::train, world.size(), world.rank());
  const auto t0 = std::chrono::steady_clock::now();
  Loader loader(data, lo);
  const int64_t per_epoch = loader.steps_per_epoch();
  CZ_CHECK(per_epoch > 0, "{} has {} examples, fewer than one micro-batch of {} across {} rank(s)",
           flag_arg(cfg, &TrainConfig::data), data->size(), lo.batch_size, world.size());
  LoaderOnlyReport r;
  r.batches = cfg.steps > 0    ? cfg.steps * cfg.grad_accum
              : cfg.epochs > 0 ? cfg.epochs * per_epoch
                               : kLoaderOnlyBatches;
  int64_t images = 0, epoch = 0;
  loader.start_epoch(0);
  for (int64_t b = 0; b < r.batches; ++b) {
    std::optional<Batch> batch = loader.next();
    if (!batch) {
      loader.start_epoch(++epoch);
      batch = loader.next();
    }
    CZ_ASSERT(batch.has_value(), "loader produced no batch for epoch {}", epoch);
    images += batch->labels.numel();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The job's rate: every rank's images over the slowest rank's time.
  if (world.size() > 1) {
    MPI_Allreduce(MPI_IN_PLACE, &images, 1, MPI_INT64_T, MPI_SUM, world.comm());
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, world.comm());
  }
  r.images = images;
  r.seconds = seconds;
  r.threads = cfg.loader_threads;
  r.ranks = world.size();
  r.img_per_s = seconds > 0 ? double(images) / seconds : 0;
  r.img_per_s_per_thread = r.img_per_s / double(r.ranks * std::max(r.threads, 1));
  return r;
}

std::string format_loader_only(const LoaderOnlyReport& r, const TrainConfig& cfg) {
  std::string aug;
  if (cfg.augment) aug += " " + std::string(flag_name(&TrainConfig::augment));
  if (!cfg.aa.empty()) aug += " " + flag_arg(cfg, &TrainConfig::aa);
  if (cfg.reprob > 0) aug += " " + flag_arg(cfg, &TrainConfig::reprob);
  if (cfg.interpolation != "bilinear") aug += " " + flag_arg(cfg, &TrainConfig::interpolation);
  if (cfg.mix_config().active()) aug += " (Mixup/CutMix)";
  return fmt::format(
      "loader only: {} batches of {} x {} rank(s), {} images in {:.3f} s: {:.1f} img/s, {:.1f} img/s per "
      "thread ({} loader thread(s) per rank{}, {}, {}x{}{}{})",
      r.batches, cfg.micro_batch, r.ranks, r.images, r.seconds, r.img_per_s, r.img_per_s_per_thread,
      r.threads, r.threads == 0 ? ": the calling thread decodes" : "", cfg.data, cfg.image_size,
      cfg.image_size, aug.empty() ? ", no augmentation" : ",", aug);
}

}  // namespace cz::train
