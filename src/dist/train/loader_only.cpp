// --loader-only: loader_only.h.
#include "dist/train/loader_only.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "dist/train/flags.h"
#include "dist/train/trainer.h"
#include "io/data/loader.h"
#include "tensor/check.h"
#include "tensor/device.h"
#include "tensor/omp_wait_policy.h"
#include "tensor/parallel.h"

namespace cz::train {

LoaderOnlyReport run_loader_only(TrainConfig cfg, dist::World& world) {
  // --loader-threads' default, as the trainer resolves it (Note [CPU threads on a CUDA rank]).
  CpuThreadsRequest req =
      cpu_threads_request(parse_device(cfg.device).is_cuda(), false, cfg.loader_threads, world.local_size());
  req.share = world.cpu_share();
  req.gathered = true;
  cfg.loader_threads = decide_cpu_threads(req).loader_threads;
  const DatasetOptions dopt = dataset_options(cfg);
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
  int64_t images = 0, steady_images = 0;
  auto t_first = t0;
  // Note [Running ahead] (io/data/loader.h): the training loader's stream crosses epochs by itself.
  for (int64_t b = 0; b < r.batches; ++b) {
    std::optional<Batch> batch = loader.next();
    CZ_ASSERT(batch.has_value(), "the training loader's stream ended at batch {}", b);
    images += batch->labels.numel();
    if (b == 0)
      t_first = std::chrono::steady_clock::now();
    else
      steady_images += batch->labels.numel();
  }
  const auto t_last = std::chrono::steady_clock::now();
  double seconds = std::chrono::duration<double>(t_last - t0).count();
  double fill = std::chrono::duration<double>(t_first - t0).count();
  double steady = std::chrono::duration<double>(t_last - t_first).count();
  // The job's rate: every rank's images over the slowest rank's time.
  if (world.size() > 1) {
    int64_t counts[2] = {images, steady_images};
    double times[3] = {seconds, fill, steady};
    MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT64_T, MPI_SUM, world.comm());
    MPI_Allreduce(MPI_IN_PLACE, times, 3, MPI_DOUBLE, MPI_MAX, world.comm());
    images = counts[0];
    steady_images = counts[1];
    seconds = times[0];
    fill = times[1];
    steady = times[2];
  }
  r.images = images;
  r.seconds = seconds;
  r.threads = cfg.loader_threads;
  r.ranks = world.size();
  r.img_per_s = seconds > 0 ? double(images) / seconds : 0;
  r.img_per_s_per_thread = r.img_per_s / double(r.ranks * std::max(r.threads, 1));
  r.fill_seconds = fill;
  r.steady_images = steady_images;
  r.steady_seconds = steady;
  r.steady_img_per_s = steady > 0 ? double(steady_images) / steady : 0;
  r.steady_img_per_s_per_thread = r.steady_img_per_s / double(r.ranks * std::max(r.threads, 1));
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
             "loader only: {} batches of {} x {} rank(s), {} images in {:.3f} s: {:.1f} img/s, {:.1f} img/s "
             "per "
             "thread ({} loader thread(s) per rank{}, {}, {}x{}{}{})",
             r.batches, cfg.micro_batch, r.ranks, r.images, r.seconds, r.img_per_s, r.img_per_s_per_thread,
             r.threads, r.threads == 0 ? ": the calling thread decodes" : "", cfg.data, cfg.image_size,
             cfg.image_size, aug.empty() ? ", no augmentation" : ",", aug) +
         (r.batches > 1
              ? fmt::format("\nloader only, steady state: {} images of the {} batches after the first "
                            "(the fill, {:.3f} s) in {:.3f} s: {:.1f} img/s, {:.1f} img/s per thread",
                            r.steady_images, r.batches - 1, r.fill_seconds, r.steady_seconds,
                            r.steady_img_per_s, r.steady_img_per_s_per_thread)
              : std::string());
}

}  // namespace cz::train
