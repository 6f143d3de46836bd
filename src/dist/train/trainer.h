// The training loop behind `convnext_zero`: model, data, optimizer, schedule, mixed precision, evaluation,
// logs. Runs on one process or data-parallel over a World (gradients averaged across ranks after backward).
#pragma once

#include <memory>
#include <optional>

#include "dist/comm/bootstrap.h"
#include "dist/comm/communicator.h"
#include "dist/train/config.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "io/train_log.h"
#include "nn/convnext.h"
#include "optim/ema.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "tensor/flat.h"

namespace cz::train {

struct StepStats {
  int64_t step = 0;  // 1-based optimizer step
  double loss = 0;   // mean training loss of the step's global batch, before the update
  double lr = 0;
  double grad_norm = 0;  // global L2 norm of the (unscaled, averaged) gradient, before clipping
  bool skipped = false;  // fp16 overflow: no update this step
  double loss_scale = 1;
  double step_time_s = 0;
  double img_per_s = 0;        // global images per second
  int64_t peak_mem_bytes = 0;  // this rank's peak allocated bytes on its device during the step
};

struct EvalResult {
  double loss = 0;  // mean cross-entropy (no label smoothing)
  double top1 = 0;  // fraction correct
  int64_t examples = 0;
};

struct TrainSummary {
  int64_t steps = 0;
  double seconds = 0;
  double img_per_s = 0;
  double final_loss = 0;
  std::optional<EvalResult> eval, eval_ema;
  int64_t peak_mem_bytes = 0;
};

class Trainer {
 public:
  Trainer(TrainConfig cfg, dist::World& world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // The whole run: total_steps() steps, evaluations, logs, export. Returns the summary (every rank).
  TrainSummary run();

  StepStats step();       // one optimizer step
  EvalResult evaluate();  // over the eval set (or --eval-batches of it), every rank together
  int64_t total_steps() const { return total_steps_; }
  int64_t steps_done() const { return step_; }

  nn::ConvNeXt& model() { return *model_; }
  const FlatParams& flat() const { return flat_; }  // fp32 master parameters and gradients
  const TrainConfig& config() const { return cfg_; }
  // The fp32 master weights under the model's parameter names (what --export-weights writes).
  nn::NamedParameters master_parameters() const;

 private:
  void build_model();
  void build_data();
  void build_optimizer();
  LoaderOptions loader_options(Split split) const;
  Batch next_batch();
  // Copies gradients into the fp32 master buffer (mixed precision), averages them across ranks.
  void reduce_gradients();
  double all_reduce_scalar(double v, bool average);
  nlohmann::json step_record(const StepStats& s) const;

  TrainConfig cfg_;
  dist::World& world_;
  Device device_;
  DType compute_dtype_ = DType::f32;
  std::unique_ptr<dist::Communicator> comm_;

  std::unique_ptr<nn::ConvNeXt> model_;
  nn::NamedParameters named_params_;
  FlatParams flat_;
  Tensor compute_params_, compute_grads_;  // low-precision copies (undefined for fp32)

  std::shared_ptr<const Dataset> train_set_, eval_set_;
  std::unique_ptr<Loader> loader_;
  int64_t epoch_ = 0;

  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<WeightEma> ema_;
  LossScaler scaler_ = LossScaler::disabled();

  int64_t total_steps_ = 0;
  int64_t step_ = 0;
  JsonLog log_;
};

}  // namespace cz::train
