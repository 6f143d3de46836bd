// Validation of the training flags.
#include "dist/train/config.h"

#include <cmath>

#include "tensor/check.h"

namespace cz::train {

void TrainConfig::validate() const {
  CZ_CHECK(depths.empty() == dims.empty(), "--depths and --dims go together (got {} depths and {} dims)",
           depths.size(), dims.size());
  CZ_CHECK(num_classes > 0, "--num-classes must be positive, got {}", num_classes);
  CZ_CHECK(image_size > 0, "--image-size must be positive, got {}", image_size);
  CZ_CHECK(drop_path >= 0 && drop_path < 1, "--drop-path must be in [0, 1), got {}", drop_path);
  CZ_CHECK(!reset_head || !init_weights.empty(), "--reset-head needs --init-weights");
  CZ_CHECK(eval_every >= 0, "--eval-every must be >= 0, got {}", eval_every);
  CZ_CHECK(eval_batches >= 0, "--eval-batches must be >= 0, got {}", eval_batches);
  CZ_CHECK(loader_threads >= 0, "--loader-threads must be >= 0, got {}", loader_threads);
  CZ_CHECK(steps >= 0, "--steps must be >= 0, got {}", steps);
  CZ_CHECK(epochs >= 0, "--epochs must be >= 0, got {}", epochs);
  CZ_CHECK(micro_batch > 0, "--micro-batch must be positive, got {}", micro_batch);
  CZ_CHECK(grad_accum > 0, "--grad-accum must be positive, got {}", grad_accum);
  CZ_CHECK(optimizer == "adamw" || optimizer == "sgd", "--optimizer must be adamw or sgd, got '{}'",
           optimizer);
  CZ_CHECK(lr >= 0, "--lr must be >= 0, got {}", lr);
  CZ_CHECK(min_lr >= 0 && min_lr <= lr, "--min-lr must be in [0, --lr], got {}", min_lr);
  CZ_CHECK(weight_decay >= 0, "--weight-decay must be >= 0, got {}", weight_decay);
  CZ_CHECK(momentum >= 0 && momentum < 1, "--momentum must be in [0, 1), got {}", momentum);
  CZ_CHECK(warmup_steps >= 0, "--warmup-steps must be >= 0, got {}", warmup_steps);
  CZ_CHECK(schedule == "cosine" || schedule == "constant", "--schedule must be cosine or constant, got '{}'",
           schedule);
  CZ_CHECK(label_smoothing >= 0 && label_smoothing < 1, "--label-smoothing must be in [0, 1), got {}",
           label_smoothing);
  CZ_CHECK(clip_grad >= 0, "--clip-grad must be >= 0 (0 disables clipping), got {}", clip_grad);
  CZ_CHECK(ema_decay >= 0 && ema_decay < 1, "--ema-decay must be in [0, 1) (0 disables EMA), got {}",
           ema_decay);
  CZ_CHECK(device == "cpu" || device.rfind("cuda", 0) == 0, "--device must be cpu or cuda[:N], got '{}'",
           device);
  CZ_CHECK(precision == "fp32" || precision == "fp16" || precision == "bf16",
           "--precision must be fp32, fp16 or bf16, got '{}'", precision);
  CZ_CHECK(std::isfinite(initial_loss_scale) && initial_loss_scale >= 1,
           "--initial-loss-scale must be a finite number >= 1, got {}", initial_loss_scale);
  CZ_CHECK(stage >= 0 && stage <= 3, "--stage must be 0, 1, 2 or 3, got {}", stage);
  CZ_CHECK(std::isfinite(bucket_mb) && bucket_mb > 0 && bucket_mb <= 1 << 16,
           "--bucket-mb must be in (0, 65536], got {}", bucket_mb);
  CZ_CHECK(prefetch >= 0 && prefetch <= 64, "--prefetch must be in [0, 64], got {}", prefetch);
  CZ_CHECK(std::isfinite(comm_timeout_s) && comm_timeout_s > 0, "--comm-timeout must be positive, got {}",
           comm_timeout_s);
  CZ_CHECK(reduce_dtype == "fp32" || reduce_dtype == "bf16" || reduce_dtype == "fp16",
           "--reduce-dtype must be fp32, bf16 or fp16, got '{}'", reduce_dtype);
  CZ_CHECK(!offload_overlap_step || offload_optimizer, "--offload-overlap-step needs --offload-optimizer");
  CZ_CHECK(checkpoint_every >= 0, "--checkpoint-every must be >= 0, got {}", checkpoint_every);
  CZ_CHECK(keep_checkpoints >= 0, "--keep-checkpoints must be >= 0, got {}", keep_checkpoints);
  CZ_CHECK(checkpoint_every == 0 || !checkpoint_dir.empty(), "--checkpoint-every needs --checkpoint-dir");
  CZ_CHECK(std::isfinite(progress_interval_s) && progress_interval_s >= 0,
           "--progress-interval must be a number of seconds >= 0, got {}", progress_interval_s);
}

nn::ConvNeXtConfig TrainConfig::model_config() const {
  nn::ConvNeXtConfig mc = depths.empty() ? nn::convnext_variant(model) : nn::ConvNeXtConfig{};
  if (!depths.empty()) {
    mc.name = "custom";
    mc.depths = depths;
    mc.dims = dims;
  }
  mc.num_classes = num_classes;
  mc.drop_path_rate = drop_path;
  return mc;
}

DType dtype_of_flag(const std::string& flag) {
  CZ_CHECK_DTYPE(flag == "fp32" || flag == "bf16" || flag == "fp16", "expected fp32, bf16 or fp16, got '{}'",
                 flag);
  return flag == "bf16" ? DType::bf16 : flag == "fp16" ? DType::f16 : DType::f32;
}

}  // namespace cz::train
