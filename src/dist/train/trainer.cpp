// The training loop. Note [Mixed precision]: parameters live in an fp32 flat buffer (the master weights, what
// the optimizer updates); with --precision bf16/fp16 the model runs on a low-precision copy of that buffer
// whose gradients are copied into the fp32 gradient buffer after backward (unscaled and checked for overflow
// with fp16's dynamic loss scaling), and the copy is refreshed from the master weights after each update.
#include "dist/train/trainer.h"

#include <chrono>
#include <cmath>

#include "io/weights.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/param_groups.h"
#include "optim/sgd.h"
#include "tensor/autograd/engine.h"
#include "tensor/cuda/runtime.h"
#if CZ_WITH_CUDA
#include "tensor/cuda/context.h"
#endif
#include "tensor/ops.h"

namespace cz::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Points every parameter's .grad at its slot of `grads` (same layout as the parameters' flat buffer).
void bind_grads(const nn::NamedParameters& params, const FlatLayout& layout, const Tensor& grads) {
  for (size_t i = 0; i < params.size(); ++i) {
    const FlatSegment& s = layout.segments[i];
    Tensor(params[i].second).set_grad(view_of_storage(grads, s.shape, grads.offset() + s.offset));
  }
}

}  // namespace

Trainer::Trainer(TrainConfig cfg, dist::World& world) : cfg_(std::move(cfg)), world_(world) {
  cfg_.validate();
  device_ = parse_device(cfg_.device);
  if (device_.is_cuda()) {
    CZ_CHECK_DEVICE(cuda_available(), "--device {}: no CUDA GPU is available{}", cfg_.device,
                    cuda_runtime::built() ? "" : " (this build has no CUDA backend)");
    // One rank honours an explicit --device cuda:N (World picked GPU 0 for it); several ranks each take the
    // GPU World chose by local rank, as two ranks on one GPU would make NCCL fail.
    const bool explicit_index = cfg_.device.find(':') != std::string::npos;
    if (world_.gpu() >= 0 && !(explicit_index && world_.size() == 1)) device_ = Device::cuda(world_.gpu());
    CZ_CHECK_DEVICE(device_.index < cuda_device_count(), "--device {}: only {} CUDA GPU(s) are visible",
                    cfg_.device, cuda_device_count());
    cuda_runtime::set_device(device_.index);
#if CZ_WITH_CUDA
    cuda::set_allow_tf32(cfg_.tf32);
    // Training runs the same convolution shapes thousands of times: time cuDNN's candidates once per shape
    // (Note [Convolution algorithms]), as PyTorch's cudnn.benchmark.
    cuda::set_conv_benchmark(true);
#endif
  }
  if (cfg_.precision != "fp32") {
    CZ_CHECK_DEVICE(device_.is_cuda(),
                    "--precision {} needs --device cuda (the CPU backend computes in fp32)", cfg_.precision);
    compute_dtype_ = cfg_.precision == "bf16" ? DType::bf16 : DType::f16;
  }
  if (world_.size() > 1) {
    dist::CommOptions opt;
    opt.device = device_;
    opt.backend = device_.is_cuda() ? dist::Backend::nccl : dist::Backend::mpi;
    opt.algorithm = dist::Algorithm::ring;
    opt.timeout_s = cfg_.comm_timeout_s;
    comm_ = dist::make_communicator(world_, opt);
  }
  if (world_.rank() == 0 && !cfg_.log.empty()) log_ = JsonLog(cfg_.log);
  build_data();
  build_model();
  build_optimizer();
}

Trainer::~Trainer() = default;

void Trainer::build_model() {
  nn::ConvNeXtConfig mc = cfg_.depths.empty() ? nn::convnext_variant(cfg_.model) : nn::ConvNeXtConfig{};
  if (!cfg_.depths.empty()) {
    mc.name = "custom";
    mc.depths = cfg_.depths;
    mc.dims = cfg_.dims;
  }
  mc.num_classes = cfg_.num_classes;
  mc.drop_path_rate = cfg_.drop_path;
  model_ = std::make_unique<nn::ConvNeXt>(mc, nn::ParamOptions{DType::f32, device_});
  model_->init_weights(cfg_.seed);
  named_params_ = model_->named_parameters();
  if (!cfg_.init_weights.empty()) {
    WeightImportOptions opt;
    if (cfg_.reset_head) opt.skip_prefixes = {"head.fc."};
    import_weights(cfg_.init_weights, named_params_, opt);
    if (cfg_.reset_head) model_->reset_head(cfg_.seed + 1);
  }
  model_->set_activation_checkpointing(cfg_.activation_checkpointing);
  flat_ = flatten_parameters(named_params_);
  if (compute_dtype_ != DType::f32) {
    compute_params_ = flat_.params.to(compute_dtype_);
    compute_grads_ = zeros({flat_.layout.numel}, compute_dtype_, device_);
    bind_parameters(named_params_, flat_.layout, compute_params_);
    bind_grads(named_params_, flat_.layout, compute_grads_);
  }
  if (comm_) {  // every rank starts from rank 0's weights
    comm_->broadcast(flat_.params, 0)->wait();
    if (compute_params_.defined()) {
      NoGradGuard no_grad;
      compute_params_.copy_(flat_.params);
    }
  }
}

// Both splits read this rank's share of global batches of micro-batch x ranks; evaluation reads every example
// once, in file order, unaugmented.
LoaderOptions Trainer::loader_options(Split split) const {
  const bool train = split == Split::train;
  LoaderOptions lo;
  lo.batch_size = cfg_.micro_batch * world_.size();
  lo.image_size = cfg_.image_size;
  lo.shuffle = train && cfg_.shuffle;
  lo.augment = train && cfg_.augment;
  lo.drop_last = train;
  lo.seed = cfg_.seed;
  lo.world = world_.size();
  lo.rank = world_.rank();
  lo.threads = cfg_.loader_threads;
  return lo;
}

void Trainer::build_data() {
  DatasetOptions dopt;
  dopt.image_size = cfg_.image_size;
  train_set_ = open_dataset(cfg_.data, Split::train, dopt);
  CZ_CHECK(train_set_->num_classes() <= cfg_.num_classes,
           "--num-classes {} is smaller than the {} classes of --data {}", cfg_.num_classes,
           train_set_->num_classes(), cfg_.data);
  if (!cfg_.eval_data.empty() || has_eval_split(cfg_.data))
    eval_set_ = open_eval_dataset(cfg_.data, cfg_.eval_data, dopt, train_set_.get());

  const LoaderOptions lo = loader_options(Split::train);
  loader_ = std::make_unique<Loader>(train_set_, lo);
  const int64_t per_epoch = loader_->steps_per_epoch() / cfg_.grad_accum;
  CZ_CHECK(
      per_epoch > 0 || cfg_.steps > 0,
      "--data {} has {} examples, fewer than one global batch of {} (--micro-batch x --grad-accum x ranks)",
      cfg_.data, train_set_->size(), cfg_.global_batch(world_.size()));
  CZ_CHECK(loader_->steps_per_epoch() > 0,
           "--data {} has {} examples, fewer than one micro-batch of {} across {} rank(s)", cfg_.data,
           train_set_->size(), lo.batch_size, world_.size());
  total_steps_ = cfg_.steps > 0 ? cfg_.steps : cfg_.epochs * per_epoch;
  loader_->start_epoch(0);
}

void Trainer::build_optimizer() {
  const ShardRange all = ShardRange::whole(flat_.layout);
  const auto hyper = timm_weight_decay(flat_.layout, cfg_.weight_decay);
  if (cfg_.optimizer == "sgd") {
    SgdConfig sc;
    sc.momentum = cfg_.momentum;
    optimizer_ = std::make_unique<Sgd>(flat_.layout, all, hyper, sc, DType::f32, device_);
  } else {
    optimizer_ = std::make_unique<AdamW>(flat_.layout, all, hyper, AdamWConfig{}, DType::f32, device_);
  }
  schedule_ = std::make_unique<LrSchedule>(
      cfg_.schedule == "constant"
          ? constant_schedule(cfg_.lr, cfg_.warmup_steps)
          : cosine_schedule(cfg_.lr, cfg_.min_lr, std::max<int64_t>(total_steps_, 1), cfg_.warmup_steps));
  if (cfg_.ema_decay > 0) ema_ = std::make_unique<WeightEma>(flat_.params, cfg_.ema_decay);
  if (compute_dtype_ == DType::f16) {
    LossScalerConfig sc;
    sc.init_scale = cfg_.initial_loss_scale;
    scaler_ = LossScaler(sc);
  }
}

Batch Trainer::next_batch() {
  std::optional<Batch> b = loader_->next();
  if (!b) {
    loader_->start_epoch(++epoch_);
    b = loader_->next();
  }
  CZ_ASSERT(b.has_value(), "loader produced no batch for epoch {}", epoch_);
  return std::move(*b);
}

double Trainer::all_reduce_scalar(double v, bool average) {
  if (!comm_) return v;
  // On the communicator's device: the NCCL backend takes CUDA buffers only.
  Tensor t = full({1}, v, DType::f64, device_);
  comm_->all_reduce(t, average ? dist::ReduceOp::avg : dist::ReduceOp::sum)->wait();
  return t.item();
}

void Trainer::reduce_gradients() {
  NoGradGuard no_grad;
  if (compute_grads_.defined()) flat_.grads.copy_(compute_grads_);
  if (comm_) comm_->all_reduce(flat_.grads, dist::ReduceOp::avg)->wait();
}

StepStats Trainer::step() {
  const auto t0 = Clock::now();
  Allocator& alloc = allocator_for(device_);
  alloc.reset_peak();
  StepStats s;
  s.step = ++step_;
  s.lr = schedule_->lr_at(s.step);
  s.loss_scale = scaler_.scale();
  {
    NoGradGuard no_grad;
    (compute_grads_.defined() ? compute_grads_ : flat_.grads).zero_();
  }
  model_->train();
  // The micro-steps' losses are summed on the device and read once, after the last backward: a read per
  // micro-step would make the host wait for each backward before queuing the next micro-step.
  Tensor loss_sum;
  const int64_t micro = cfg_.micro_batch;
  for (int64_t a = 0; a < cfg_.grad_accum; ++a) {
    Batch batch = next_batch();
    Tensor images = batch.images.to(device_).to(compute_dtype_);
    Tensor labels = batch.labels.to(device_);
    // Note [Drop-path masks]: keyed by the sample's index in the step's global batch.
    model_->set_drop_path_context(cfg_.seed, uint64_t(s.step), (a * world_.size() + world_.rank()) * micro);
    Tensor logits = (*model_)(images).to(DType::f32);
    Tensor loss = cross_entropy(logits, labels, cfg_.label_smoothing);
    scale(loss, s.loss_scale / double(cfg_.grad_accum)).backward();
    NoGradGuard no_grad;
    loss_sum = loss_sum.defined() ? add(loss_sum, loss.detach()) : loss.detach();
  }
  s.loss = all_reduce_scalar(loss_sum.item() / double(cfg_.grad_accum), true);
  reduce_gradients();

  bool take_step = true;
  if (scaler_.enabled()) {
    const bool overflow = scaler_.unscale_(flat_.grads);
    take_step = scaler_.update(overflow);
  }
  s.skipped = !take_step;
  s.grad_norm = std::sqrt(grad_sq_norm(flat_.grads).item());
  if (take_step) {
    if (cfg_.clip_grad > 0) scale_(flat_.grads, clip_coefficient(s.grad_norm, cfg_.clip_grad));
    optimizer_->step(flat_.params, flat_.grads, s.lr);
    if (ema_) ema_->update(flat_.params);
    if (compute_params_.defined()) {
      NoGradGuard no_grad;
      compute_params_.copy_(flat_.params);
    }
  }
  if (device_.is_cuda()) current_stream(device_).synchronize();
  s.step_time_s = seconds_since(t0);
  s.img_per_s = double(cfg_.global_batch(world_.size())) / s.step_time_s;
  s.peak_mem_bytes = alloc.stats().peak_allocated_bytes;
  return s;
}

EvalResult Trainer::evaluate() {
  CZ_CHECK(eval_set_ != nullptr,
           "evaluation needs an eval set: --data {} has no eval split; give --eval-data", cfg_.data);
  Loader loader(eval_set_, loader_options(Split::eval));
  loader.start_epoch(0);
  model_->eval();
  NoGradGuard no_grad;
  double loss_sum = 0, correct = 0, n = 0;
  int64_t batches = 0;
  while (auto batch = loader.next()) {
    if (cfg_.eval_batches > 0 && batches++ >= cfg_.eval_batches) break;
    if (batch->labels.numel() == 0) continue;
    Tensor logits = (*model_)(batch->images.to(device_).to(compute_dtype_)).to(DType::f32);
    Tensor labels = batch->labels.to(device_);
    const double bn = double(labels.numel());
    loss_sum += cross_entropy(logits, labels, 0.0).item() * bn;
    correct += double(count_correct(logits, labels));
    n += bn;
  }
  model_->train();
  EvalResult r;
  n = all_reduce_scalar(n, false);
  r.examples = int64_t(n);
  r.loss = n > 0 ? all_reduce_scalar(loss_sum, false) / n : NAN;
  r.top1 = n > 0 ? all_reduce_scalar(correct, false) / n : NAN;
  return r;
}

nn::NamedParameters Trainer::master_parameters() const {
  nn::NamedParameters out;
  for (const FlatSegment& s : flat_.layout.segments)
    out.emplace_back(s.name, view_of_storage(flat_.params, s.shape, flat_.params.offset() + s.offset));
  return out;
}

nlohmann::json Trainer::step_record(const StepStats& s) const {
  nlohmann::json j = {{"step", s.step},           {"epoch", epoch_},
                      {"loss", s.loss},           {"lr", s.lr},
                      {"grad_norm", s.grad_norm}, {"step_time_s", s.step_time_s},
                      {"img_per_s", s.img_per_s}, {"peak_mem_bytes", s.peak_mem_bytes}};
  if (scaler_.enabled()) {
    j["loss_scale"] = s.loss_scale;
    j["skipped"] = s.skipped;
  }
  return j;
}

TrainSummary Trainer::run() {
  const bool lead = world_.rank() == 0;
  ProgressBar bar(total_steps_, lead && cfg_.progress && stderr_is_terminal());
  TrainSummary sum;
  const auto t0 = Clock::now();
  auto run_eval = [&](int64_t at_step) {
    bar.finish();
    sum.eval = evaluate();
    nlohmann::json j = {{"split", "eval"},
                        {"step", at_step},
                        {"loss", sum.eval->loss},
                        {"top1", sum.eval->top1},
                        {"examples", sum.eval->examples}};
    if (ema_) {
      ema_->swap(flat_.params);
      if (compute_params_.defined()) {
        NoGradGuard no_grad;
        compute_params_.copy_(flat_.params);
      }
      sum.eval_ema = evaluate();
      ema_->swap(flat_.params);
      if (compute_params_.defined()) {
        NoGradGuard no_grad;
        compute_params_.copy_(flat_.params);
      }
      j["ema_loss"] = sum.eval_ema->loss;
      j["ema_top1"] = sum.eval_ema->top1;
    }
    log_.write(j);
    if (lead) {
      fmt::print("eval @ step {}: loss {:.4f}  top1 {:.2f}%", at_step, sum.eval->loss, 100 * sum.eval->top1);
      if (sum.eval_ema)
        fmt::print("  (EMA: loss {:.4f}  top1 {:.2f}%)", sum.eval_ema->loss, 100 * sum.eval_ema->top1);
      fmt::print("\n");
      std::fflush(stdout);
    }
  };
  int64_t images = 0;
  double time_in_steps = 0;
  for (int64_t i = 0; i < total_steps_; ++i) {
    const StepStats s = step();
    images += cfg_.global_batch(world_.size());
    time_in_steps += s.step_time_s;
    sum.final_loss = s.loss;
    sum.peak_mem_bytes = std::max(sum.peak_mem_bytes, s.peak_mem_bytes);
    CZ_CHECK(std::isfinite(s.loss) || s.skipped,
             "training diverged at step {}: loss is {} (try a lower --lr or --clip-grad)", s.step, s.loss);
    log_.write(step_record(s));
    bar.update(s.step, s.loss, double(images) / time_in_steps);
    if (cfg_.eval_every > 0 && s.step % cfg_.eval_every == 0 && s.step < total_steps_ && eval_set_)
      run_eval(s.step);
  }
  bar.finish();
  sum.steps = total_steps_;
  sum.seconds = seconds_since(t0);
  sum.img_per_s = time_in_steps > 0 ? double(images) / time_in_steps : 0;
  if (eval_set_) run_eval(total_steps_);
  if (!cfg_.export_weights.empty() && lead) {
    WeightExportOptions opt;
    opt.conv_mlp = model_->config().conv_mlp;
    export_weights(cfg_.export_weights, master_parameters(), opt);
  }
  return sum;
}

}  // namespace cz::train
