// The training loop. Note [Mixed precision]: the fp32 master weights (or this rank's shard of them) are what
// the optimizer updates; with --precision bf16/fp16 the model runs on a 16-bit compute copy whose gradients
// become fp32 master gradients after reduction (unscaled and checked for overflow on every rank with fp16's
// dynamic loss scaling), and the copy is refreshed from the master weights after each update. The ZeRO
// engine (dist/zero/engine.h) does all of it, at every stage. On the CPU, bf16 is the GEMMs' precision only
// (Note [bf16 on the CPU] in tensor/cpu/gemm_bf16.cpp): the model computes in fp32 and the engine has no
// copy.
#include "dist/train/trainer.h"

#include "dist/train/flags.h"
#include "dist/train/stop.h"

#include <chrono>
#include <cmath>

#include <utility>

#include "io/checkpoint/checkpoint.h"
#include "io/checkpoint/weights.h"
#include "io/data/model_input.h"
#include "tensor/autograd/engine.h"
#include "tensor/cuda/runtime.h"
#include "tensor/omp_wait_policy.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"
#include "tensor/trace.h"

namespace cz::train {
namespace {

// "93.75%", or "n/a" for a top-5 below 5 classes.
std::string percent(double fraction) {
  return std::isnan(fraction) ? std::string("n/a") : fmt::format("{:.2f}%", 100 * fraction);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

StepStats Trainer::step() {
  const auto t0 = Clock::now();  // waiting for the loader counts
  std::vector<Batch> batches;
  for (int64_t a = 0; a < cfg_.grad_accum; ++a) batches.push_back(feed_->next());
  // Note [Data wait]: the time this rank's step waited for its batches, inside step_time_s (and on CUDA
  // the wait for the next step's first batch, taken ahead inside this step).
  const double data_wait_s = seconds_since(t0);
  trace::complete("data wait", "data", t0, Clock::now(), "data wait");
  feed_->arm_ahead();  // run_step takes the next step's first batch ahead (CUDA)
  StepStats s = run_step(batches, t0);
  s.data_wait_s = data_wait_s + feed_->disarm_ahead();
  feed_->dump(batches, s.step);  // after the step's timer
  return s;
}

StepStats Trainer::step(std::span<const Batch> micro_batches) {
  CZ_CHECK(int64_t(micro_batches.size()) == cfg_.grad_accum, "Trainer::step: {} micro-batches for {}",
           micro_batches.size(), flag_arg(cfg_, &TrainConfig::grad_accum));
  return run_step(micro_batches, Clock::now());
}

StepStats Trainer::run_step(std::span<const Batch> micro_batches, Clock::time_point t0) {
  Allocator& alloc = allocator_for(device_);
  alloc.reset_peak();
  input_s_ = loss_wait_s_ = 0;
  StepStats s;
  s.step = ++step_;
  s.stage = cfg_.stage;
  s.offload = cfg_.offload_optimizer;
  s.loss_scaling = scaler_.enabled();
  s.lr = schedule_->lr_at(s.step);
  s.loss_scale = scaler_.scale();
  engine_->begin_step(s.lr, cfg_.clip_grad, scaler_);
  if (loss_scale_.defined()) loss_scale_.fill_(s.loss_scale);
  model_->train();
  const Tensor loss_sum = forward_backward(micro_batches, s.step);
  feed_->take_ahead();  // CUDA: its copy runs beside this step's queued backward
  if (graphs_) {
    // The update's graph is queued before the host waits for the loss, so the device runs it right after
    // backward (the loss is a copy the update does not touch).
    update_and_gather(s);
    s.loss = mean_loss(loss_sum);
    graphs_->end_step();
  } else {
    s.loss = mean_loss(loss_sum);
    update_and_gather(s);
  }
  if (tracer_) tracer_->memory_sample(alloc.stats().allocated_bytes);
  if (device_.is_cuda()) current_stream(device_).synchronize();
  // A replayed update decided on the device: the norm and the overflow flag are read now that the step is
  // done (the LossScaler and the step count advance from the flag), for the log.
  if (graphs_) engine_->finish_device_update(scaler_, s);
  const auto t1 = Clock::now();
  s.step_time_s = std::chrono::duration<double>(t1 - t0).count();
  // The traced step's span is the logged step_time_s's interval, data wait included.
  if (trace::active()) trace::complete(fmt::format("step {}", s.step), "step", t0, t1, "step");
  s.img_per_s = double(cfg_.global_batch(world_.size())) / s.step_time_s;
  s.peak_mem_bytes = alloc.stats().peak_allocated_bytes;
  if (graphs_) s.peak_mem_bytes = std::max(s.peak_mem_bytes, graphs_->capture_peak());
  s.epoch = feed_->epoch();
  return s;
}

// Forward, loss and backward of each micro-batch (Note [Where a step communicates]); returns the sum of
// their losses, on the device. The micro-steps' losses are summed on the device and read once, after the
// last backward: a read per micro-step would make the host wait for each backward before queuing the next
// micro-step.
Tensor Trainer::forward_backward(std::span<const Batch> micro_batches, int64_t step) {
  Allocator& alloc = allocator_for(device_);
  Tensor loss_sum;
  const int64_t micro = cfg_.micro_batch;
  for (int64_t a = 0; a < cfg_.grad_accum; ++a) {
    const Batch& batch = micro_batches[size_t(a)];
    const auto input_t0 = Clock::now();
    Tensor images = model_input(batch, device_).to(compute_dtype_);
    // The labels, or a mixed batch's soft targets with the smoothing folded in (Note [Mixing within a
    // micro-batch]).
    const bool soft = batch.targets.defined();
    Tensor targets = (soft ? batch.targets : batch.labels).to(device_);
    input_s_ += seconds_since(input_t0);
    // Note [Drop-path masks]: keyed by the sample's index in the step's global batch.
    model_->set_drop_path_context(cfg_.seed, uint64_t(step), (a * world_.size() + world_.rank()) * micro);
    const bool last = a + 1 == cfg_.grad_accum;
    // Forward, loss and backward: what --cuda-graphs captures and replays (Note [CUDA graphs for the step]).
    // The logits outlive the loss's sum below, as the memory planner's walk of a step has them
    // (plan/step_replay).
    Tensor logits;
    auto micro_step = [&](const Tensor& x, const Tensor& y) {
      std::optional<trace::Span> phase(std::in_place, "forward",
                                       "phase");  // --trace's compute lane, to the loss
      logits = (*model_)(x).to(DType::f32);
      Tensor loss =
          soft ? soft_target_cross_entropy(logits, y) : cross_entropy(logits, y, cfg_.label_smoothing);
      phase.reset();
      if (tracer_) tracer_->memory_sample(alloc.stats().allocated_bytes);  // the activations' peak
      // The mean over the micro-steps, then fp16's loss scale (a power of two: the product is the same as
      // one multiply by their quotient).
      Tensor scaled = scale(loss, 1.0 / double(cfg_.grad_accum));
      if (loss_scale_.defined()) scaled = mul(scaled, loss_scale_);
      backward_and_reduce(scaled, last);
      if (tracer_) tracer_->memory_sample(alloc.stats().allocated_bytes);
      return loss.detach();
    };
    Tensor loss =
        graphs_ ? graphs_->micro_step(last, images, targets, micro_step) : micro_step(images, targets);
    NoGradGuard no_grad;
    loss_sum = loss_sum.defined() ? add(loss_sum, loss) : loss;
  }
  return loss_sum;
}

// Note [Where a step communicates]: the collectives a step causes, in the order the loop causes them (the
// rules of when are zero::ReduceSchedule's and zero::UnitSchedule's, Note [One schedule]):
//  * forward: at stage 3 each unit is all-gathered at its module's hook, the next --prefetch ahead; at stages
//    1-2 each module first waits for the previous step's all-gathers of its parameters;
//  * backward_and_reduce: each bucket's reduction (stage 0 all-reduce, 1-3 reduce-scatter) starts from the
//    hook of its last gradient while backward runs (stage 3 gathers each unit again first); the call returns
//    once every reduction has ended (stages 0-1: on the last micro-step only);
//  * mean_loss: an all-reduce of one scalar;
//  * update_and_gather: the global norm's all-reduce (stages 1-3), the update of this rank's shard, then the
//    all-gathers of the updated parameters (stages 1-2), left in flight for the next forward.
void Trainer::backward_and_reduce(const Tensor& loss, bool last_micro_step) {
  trace::Span phase("backward", "phase");  // --trace's compute lane
  engine_->backward(loss, last_micro_step);
  trace::set_block({});  // Note [Trace blocks]: the last block's run ends with backward
}

double Trainer::mean_loss(const Tensor& loss_sum) {
  const double mine = loss_sum.item() / double(cfg_.grad_accum);  // waits for the device's backward
  const auto t0 = Clock::now();
  const double mean = group_.all_reduce(mine, dist::ReduceOp::avg);
  loss_wait_s_ += seconds_since(t0);  // the wait for the other ranks (Note [Every rank's step])
  return mean;
}

void Trainer::update_and_gather(StepStats& s) {
  trace::Span phase("update", "phase");
  if (graphs_)  // Note [The optimizer's device scalars]: finished in run_step after its synchronize
    graphs_->update([this] { engine_->device_update(scaler_.enabled()); });
  else
    engine_->step(scaler_, s);
}

EvalResult Trainer::evaluate() {
  CZ_CHECK(feed_->eval_set() != nullptr, "evaluation needs an eval set: {} has no eval split; give {}",
           flag_arg(cfg_, &TrainConfig::data), flag_name(&TrainConfig::eval_data));
  engine_->synchronize();  // offload's delayed update, stage 1-2's parameter all-gathers
  Loader loader(feed_->eval_set(), feed_->loader_options(Split::eval));
  loader.start_epoch(0);
  model_->eval();
  NoGradGuard no_grad;
  // Top-5 means something with 5 classes or more (EvalResult::top5).
  const int64_t classes = model_->spec().num_classes();
  const bool top5 = classes >= 5;
  double loss_sum = 0, correct = 0, correct5 = 0, n = 0;
  int64_t batches = 0;
  while (auto batch = loader.next()) {
    if (cfg_.eval_batches > 0 && batches++ >= cfg_.eval_batches) break;
    if (batch->labels.numel() == 0) continue;
    Tensor logits = (*model_)(model_input(*batch, device_).to(compute_dtype_)).to(DType::f32);
    Tensor labels = batch->labels.to(device_);
    const double bn = double(labels.numel());
    loss_sum += cross_entropy(logits, labels, 0.0).item() * bn;
    correct += double(count_correct(logits, labels));
    if (top5) correct5 += double(count_top_k(logits, labels, 5));
    n += bn;
  }
  model_->train();
  EvalResult r;
  n = group_.all_reduce(n, dist::ReduceOp::sum);
  r.examples = int64_t(n);
  r.loss = n > 0 ? group_.all_reduce(loss_sum, dist::ReduceOp::sum) / n : NAN;
  r.top1 = n > 0 ? group_.all_reduce(correct, dist::ReduceOp::sum) / n : NAN;
  r.top5 = n > 0 && top5 ? group_.all_reduce(correct5, dist::ReduceOp::sum) / n : NAN;
  return r;
}

nn::NamedParameters Trainer::master_parameters() {
  return engine_->master_parameters();
}

void TrainSummary::add(const StepStats& s) {
  final_loss = s.loss;
  peak_mem_bytes = std::max(peak_mem_bytes, s.peak_mem_bytes);
  model_state_bytes = s.model_state_bytes;
  comm_s += s.comm_s;
  comm_exposed_s += s.comm_exposed_s;
  data_wait_s += s.data_wait_s;
}

ProgressMode Trainer::progress_mode() const {
  if (world_.rank() != 0 || !cfg_.progress) return ProgressMode::off;
  return stderr_is_terminal() ? ProgressMode::bar : ProgressMode::lines;
}

int Trainer::step_boundary() {
  const StepBoundary::Agreement a = boundary_.agree(step_, checkpointer_->unwritten());
  if (a.written) checkpointer_->finish();  // a save in flight is published once every rank has written it
  return a.signal;
}

// An evaluation after `at_step` of the weights and of the EMA: into `sum`, the best checkpoints, the log and
// the console.
void Trainer::evaluate_and_log(int64_t at_step, TrainSummary& sum) {
  sum.eval = evaluate();
  // top5 is null below 5 classes (EvalResult::top5).
  const auto fraction = [](double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); };
  nlohmann::json j = {{"split", "eval"},
                      {"step", at_step},
                      {"loss", sum.eval->loss},
                      {"top1", sum.eval->top1},
                      {"top5", fraction(sum.eval->top5)},
                      {"examples", sum.eval->examples}};
  if (engine_->has_ema()) {
    engine_->swap_ema();
    sum.eval_ema = evaluate();
    engine_->swap_ema();
    j["ema_loss"] = sum.eval_ema->loss;
    j["ema_top1"] = sum.eval_ema->top1;
    j["ema_top5"] = fraction(sum.eval_ema->top5);
  }
  track_best(best_, *sum.eval, "best");
  if (sum.eval_ema) track_best(best_ema_, *sum.eval_ema, "best_ema");
  sum.best = best_;
  sum.best_ema = best_ema_;
  write_record(j);
  if (world_.rank() == 0) {
    std::string line = fmt::format("eval @ step {}: loss {:.4f}  top1 {:.2f}%  top5 {}", at_step,
                                   sum.eval->loss, 100 * sum.eval->top1, percent(sum.eval->top5));
    if (sum.eval_ema)
      line += fmt::format("  (EMA: loss {:.4f}  top1 {:.2f}%  top5 {})", sum.eval_ema->loss,
                          100 * sum.eval_ema->top1, percent(sum.eval_ema->top5));
    console_print(stdout, line + "\n");  // Note [One console]: not onto the progress bar
  }
}

// After each step of run(): its figures into `t` and `sum`, every rank's step gathered when due, the check
// for divergence and the step's record.
void Trainer::account_step(const StepStats& s, RunTotals& t, TrainSummary& sum) {
  ++t.steps;
  boundary_.step_took(s.step_time_s);
  t.images += cfg_.global_batch(world_.size());
  t.time_in_steps += s.step_time_s;
  if (t.steps > 1) {
    t.wait_after_first += s.data_wait_s;
    t.time_after_first += s.step_time_s;
    sum.data_wait_fraction = t.wait_after_first / t.time_after_first;
  }
  if (t.steps == DataFeed::kLoaderCheckSteps)
    feed_->warn_if_loader_bound(t.wait_after_first, t.time_after_first, step_);
  sum.add(s);
  if (rank_stats_.enabled()) {
    rank_stats_.add(s.step_time_s, s.data_wait_s, input_s_, s.comm_wait_s + loss_wait_s_);
    if (rank_stats_.due(s.step, s.step == total_steps_)) gather_rank_stats(s.step);
  }
  CZ_CHECK(std::isfinite(s.loss) || s.skipped,
           "training diverged at step {}: loss is {} (try a lower {} or {})", s.step, s.loss,
           flag_name(&TrainConfig::lr), flag_name(&TrainConfig::clip_grad));
  nlohmann::json record = zero::to_json(s);
  record["split"] = "train";  // beside evaluations' "eval": readers select steps by it
  write_record(std::move(record));
}

// At the end of run(), with --checkpoint-dir: a checkpoint of the last step, published, and after a stop by
// `stop_signal` the stop record.
void Trainer::save_final_checkpoint(int stop_signal) {
  if (cfg_.checkpoint_dir.empty()) return;
  if (checkpointer_->saved_step() != step_) save_checkpoint();
  finish_pending_save();
  // Note [The stop record]: what a job script reads where the launcher's exit code cannot be trusted.
  if (stop_signal != 0 && world_.rank() == 0) checkpointer_->write_stop_record(stop_signal, step_);
}

// --export-weights, at the end of run(): gathered on every rank (the engine's master_parameters is
// collective), written by rank 0.
void Trainer::export_final_weights() {
  if (cfg_.export_weights.empty()) return;
  const nn::NamedParameters weights = master_parameters();
  if (world_.rank() == 0) {
    WeightExportOptions opt;
    opt.conv_mlp = cfg_.model_config().conv_mlp;
    opt.class_names = class_names();
    export_weights(cfg_.export_weights, weights, opt);
  }
}

TrainSummary Trainer::run() {
  // The ETA counts only the steps this process runs, from the resumed one (io/log/train_log.h).
  ProgressBar bar(total_steps_, progress_mode(), cfg_.progress_interval_s, step_);
  TrainSummary sum;
  RunTotals t;
  const auto t0 = Clock::now();
  // From a resumed step onwards too; each boundary publishes a finished save and may stop the run.
  while (step_ < total_steps_ && (sum.stop_signal = step_boundary()) == 0) {
    if (tracer_) tracer_->before_step(step_ + 1);
    const StepStats s = step();
    if (tracer_) tracer_->after_step(s.step);
    account_step(s, t, sum);
    bar.update(s.step, s.loss, double(t.images) / t.time_in_steps, sum.data_wait_fraction);
    if (cfg_.eval_every > 0 && s.step % cfg_.eval_every == 0 && s.step < total_steps_ && feed_->eval_set())
      evaluate_and_log(s.step, sum);
    if (cfg_.checkpoint_every > 0 && s.step % cfg_.checkpoint_every == 0) {
      save_checkpoint();
      // Note [Steps lost to a failure]: a background save is published at the first step boundary after
      // every rank's file is durable, which on short steps is several steps later (3 hosts, 50 ms steps: a
      // failure at step 17 went back to step 10), so a failure can lose up to --checkpoint-every plus the
      // save's steps; --checkpoint-sync publishes before the next step and bounds it by --checkpoint-every.
      if (cfg_.checkpoint_sync) finish_pending_save();
    }
  }
  bar.finish();
  if (tracer_) tracer_->finish();  // a run that ended inside --trace-steps
  feed_->finish_dump();
  count_skipped_samples(sum);
  save_final_checkpoint(sum.stop_signal);
  sum.steps = t.steps;
  sum.last_step = step_;
  sum.checkpoint = checkpointer_->latest();
  sum.seconds = seconds_since(t0);
  sum.img_per_s = t.time_in_steps > 0 ? double(t.images) / t.time_in_steps : 0;
  if (cfg_.comms_table) report_comms(t.steps);
  if (feed_->eval_set() && sum.stop_signal == 0) evaluate_and_log(total_steps_, sum);
  export_final_weights();
  return sum;
}

}  // namespace cz::train
