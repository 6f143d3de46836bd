// The training loop. Note [Mixed precision]: the fp32 master weights (or this rank's shard of them) are what
// the optimizer updates; with --precision bf16/fp16 the model runs on a 16-bit compute copy whose gradients
// become fp32 master gradients after reduction (unscaled and checked for overflow on every rank with fp16's
// dynamic loss scaling), and the copy is refreshed from the master weights after each update. The ZeRO
// engine (dist/zero/engine.h) does all of it, at every stage. On the CPU, bf16 is the GEMMs' precision only
// (Note [bf16 on the CPU] in tensor/cpu/gemm_bf16.cpp): the model computes in fp32 and the engine has no
// copy.
#include "dist/train/trainer.h"

#include "dist/train/cpu_gemm_setup.h"
#include "dist/train/flags.h"
#include "dist/train/param_groups.h"
#include "dist/train/stop.h"
#include "tensor/cpu/row_tiles.h"

#include <chrono>
#include <cmath>

#include <functional>
#include <utility>

#include "io/checkpoint/checkpoint.h"
#include "io/checkpoint/weights.h"
#include "io/data/model_input.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/autograd/engine.h"
#include "tensor/cpu/gemm_bf16.h"
#include "tensor/cuda/runtime.h"
#if CZ_WITH_CUDA
#include "tensor/cuda/context.h"
#endif
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

// The optimizer over the shard the engine lays out: --optimizer with timm's weight-decay rule (not on biases
// and 1-D parameters) and --layer-decay's lr scales (param_groups.h).
zero::MakeOptimizer make_optimizer(const TrainConfig& c) {
  CZ_CHECK(c.optimizer == "adamw" || c.optimizer == "sgd", "unknown optimizer '{}' (adamw or sgd)",
           c.optimizer);
  return [c](const zero::ShardSpec& shard) -> std::unique_ptr<Optimizer> {
    const auto hyper = param_hyper(c, shard.flat);
    if (c.optimizer == "sgd") {
      SgdConfig sc;
      sc.momentum = c.momentum;
      return std::make_unique<Sgd>(shard.flat, shard.ranges, hyper, sc, DType::f32, shard.device,
                                   shard.pinned);
    }
    return std::make_unique<AdamW>(shard.flat, shard.ranges, hyper, AdamWConfig{}, DType::f32, shard.device,
                                   shard.pinned);
  };
}

// One line for --init-weights: what was read, in which key style, and what the head became.
std::string describe_import(const TrainConfig& c, const WeightImportReport& r) {
  std::string s =
      fmt::format("{} {}: {} tensors ({:.2f}M values) with {} keys", flag_name(&TrainConfig::init_weights),
                  c.init_weights, r.tensors, double(r.elements) / 1e6, r.key_style);
  if (c.reset_head)
    s += fmt::format("; the head (head.fc.*) was not loaded ({}): a new one for {} classes",
                     flag_name(&TrainConfig::reset_head), c.num_classes);
  else
    s += "; the head loaded with the rest";
  return s;
}

zero::MakeEma make_ema(const TrainConfig& c) {
  if (c.ema_decay <= 0) return {};
  return [decay = c.ema_decay](std::span<const Tensor> weights) {
    return std::make_unique<WeightEma>(weights, decay);
  };
}

}  // namespace

Trainer::Trainer(TrainConfig cfg, dist::World& world) : cfg_(std::move(cfg)), world_(world) {
  cfg_.validate();
  choose_device();
  const std::string comm_kind = connect();  // for --cuda-graphs: "" without a communicator
  // hpZ keeps backward's gathers on the host: with one host there is nothing to keep them from.
  CZ_CHECK(!cfg_.hpz || mesh_.hosts().num_hosts() > 1,
           "{} needs more than one host; all {} rank(s) of this launch are on {} (with one host, plain {} 3 "
           "already gathers inside it)",
           flag_name(&TrainConfig::hpz), world_.size(), mesh_.hosts().hosts.front(),
           flag_name(&TrainConfig::stage));
  group_ = mesh_.world();
  checkpointer_ =
      std::make_unique<Checkpointer>(cfg_.checkpoint_dir, group_, world_.rank() == 0 && cfg_.progress);
  boundary_ = StepBoundary(control_, cfg_.end_margin);
  check_outputs();
  rank_stats_ = RankStats(world_.size() > 1 ? int(cfg_.rank_stats_every) : 0);
  feed_ = std::make_unique<DataFeed>(cfg_, world_, device_);
  total_steps_ = cfg_.steps > 0 ? cfg_.steps : cfg_.epochs * feed_->steps_per_epoch();
  CZ_CHECK(!cfg_.keep_best || feed_->eval_set(),
           "{} keeps the checkpoint of the best evaluation, but {} has no eval split; "
           "give {}",
           flag_name(&TrainConfig::keep_best), flag_arg(cfg_, &TrainConfig::data),
           flag_name(&TrainConfig::eval_data));
  build_model();
  if (!device_.is_cuda()) choose_cpu_gemms();
  build_schedule();
  if (!cfg_.resume.empty()) resume(cfg_.resume);
  open_log();  // after the resume, which says from which step the log continues
  if (!cfg_.trace.empty()) {
    tracer_ = std::make_unique<StepTracer>(cfg_.trace, parse_trace_steps(cfg_.trace_steps, "--trace-steps"),
                                           control_, world_.rank(), world_.size(), device_);
    tracer_->watch_blocks(*model_, model_->units(), cfg_.stage == 3);
  }
  // fp16's loss scale multiplies the loss from device memory, written before each step, so that a replayed
  // micro-step scales by this step's value (Note [CUDA graphs for the step]).
  if (scaler_.enabled()) loss_scale_ = full({}, scaler_.scale(), DType::f32, device_);
  // The steps this process runs (after a resume, those left): the warm-up counts them.
  graph_plan_ = plan_cuda_graphs(graph_plan_input(cfg_, world_.size(), comm_kind, total_steps_ - step_));
  if (graph_plan_.capture) {
    graphs_ = std::make_unique<StepGraphs>(device_, graph_plan_.warmup_steps);
    engine_->use_device_update();  // the update reads its scalars from the device (a graph replays it)
  }
}

// The training device (and CUDA's process-wide settings), the compute dtype and the CPU GEMMs' precision.
void Trainer::choose_device() {
  device_ = parse_device(cfg_.device);
  if (device_.is_cuda()) {
    CZ_CHECK_DEVICE(cuda_available(), "{}: no CUDA GPU is available{}", flag_arg(cfg_, &TrainConfig::device),
                    cuda_runtime::built() ? "" : " (this build has no CUDA backend)");
    // One rank honours an explicit --device cuda:N (World picked GPU 0 for it); several ranks each take the
    // GPU World chose by local rank, as two ranks on one GPU would make NCCL fail.
    const bool explicit_index = cfg_.device.find(':') != std::string::npos;
    if (world_.gpu() >= 0 && !(explicit_index && world_.size() == 1)) device_ = Device::cuda(world_.gpu());
    CZ_CHECK_DEVICE(device_.index < cuda_device_count(), "{}: only {} CUDA GPU(s) are visible",
                    flag_arg(cfg_, &TrainConfig::device), cuda_device_count());
    cuda_runtime::set_device(device_.index);
#if CZ_WITH_CUDA
    cuda::set_allow_tf32(cfg_.tf32);
    // Training runs the same convolution shapes thousands of times: time cuDNN's candidates once per shape
    // (Note [Convolution algorithms]), as PyTorch's cudnn.benchmark; this takes effect only where the
    // reproducible default is switched off (Note [Reproducible runs]), since timing picks a different
    // algorithm, and so a different summation order, from run to run.
    cuda::set_conv_benchmark(true);
#endif
  }
  compute_dtype_ = compute_dtype(cfg_, device_.is_cuda());
  // Note [bf16 on the CPU] (tensor/cpu/gemm_bf16.cpp): the GEMMs' precision is process-wide, so every trainer
  // sets it (a test makes fp32 and bf16 trainers in one process); bf16 is refused here, with the CPU's model,
  // where it has neither AVX512_BF16 nor AMX.
  if (cpu_bf16_gemms(cfg_, device_.is_cuda())) {
    cpu::set_matmul_precision(cpu::MatmulPrecision::bf16);
    precision_note_ = fmt::format(
        "{} bf16 on the CPU: GEMMs multiply bf16-rounded operands on {} with fp32 accumulation; "
        "activations, gradients, master weights and optimizer state stay fp32",
        flag_name(&TrainConfig::precision), cpu::bf16_gemm_engine());
  } else {
    cpu::set_matmul_precision(cpu::MatmulPrecision::fp32);
  }
}

// The communicators, the mesh of their groups and the step plan; returns the kind of the world's
// communicator ("nccl", "mpi"; "" without one).
std::string Trainer::connect() {
  // At one rank, a --comm-backend named on the command line still gets a communicator of one, so that the
  // collectives' code paths run (the NCCL path of a one-GPU box among them); auto keeps none.
  const bool comm_of_one = world_.size() == 1 && cfg_.comm_backend != "auto";
  if (world_.size() > 1 || comm_of_one) return connect_ranks(comm_of_one);
  mesh_ = dist::Mesh(device_);
  control_ = dist::ProcessGroup(device_);
  dist::shard_groups(cfg_.shard_group, mesh_.hosts());  // the same checks as on a world of several
  plan_ = make_plan(mesh_.hosts());
  return "";
}

std::string Trainer::connect_ranks(bool comm_of_one) {
  dist::CommOptions opt;
  opt.device = device_;
  opt.algorithm = world_algorithm(cfg_);
  opt.timeout_s = cfg_.comm_timeout_s;
  // Note [Control communicator]: the trainer's own exchanges of a few host values (the flags' agreement
  // here, the step boundary's stop-and-publish, Note [Stopping on request]) run on a world communicator of
  // their own, MPI on host memory whatever the training device. On the world's, the step boundary queued
  // behind the parameter all-gathers that stages 1-2 launch after the update to overlap the next forward,
  // so the host waited for them at the boundary, outside the step's timer: the overlap was lost and img/s
  // overstated (ConvNeXt-femto, 2 hosts x 2 ranks at 200 Mbit/s, stage 1: 1.39 s a step on the clock, 0.75
  // s logged). MPI's own collectives (builtin) move the values without ring scratch. The ranks agree on the
  // flags (--shard-group and --hpz among them) before the mesh's groups are made: ranks naming different
  // groups would wait for each other forever.
  dist::CommOptions control;
  control.algorithm = dist::Algorithm::builtin;
  control.timeout_s = cfg_.comm_timeout_s;
  control.label = "control";
  control_comm_ = dist::make_communicator(world_, control);
  control_ = dist::ProcessGroup(control_comm_.get(), Device::cpu());
  check_ranks_agree();
  opt.backend = choose_backend();
  check_comm_impl(opt.backend);
  plan_ = make_plan(dist::host_map(world_));
  mesh_ = dist::Mesh(world_, opt, cfg_.shard_group, cfg_.hpz || plan_.two_hop(), comm_of_one);
  group_ = mesh_.world();
  // Across hosts, say how the gradient buckets' collectives go (Note [Two-level cost model]).
  if (world_.rank() == 0 && mesh_.hosts().num_hosts() > 1)
    fmt::print("{}: {}\n", flag_arg(cfg_, &TrainConfig::comm_impl),
               mesh_.world().communicator()->explain(dist::Collective::all_reduce,
                                                     size_t(bucket_bytes(cfg_.bucket_mb))));
  if (world_.rank() == 0 && plan_.two_hop())
    fmt::print("{}: {} int8 {} in two hops, inside each host then across hosts\n",
               flag_arg(cfg_, &TrainConfig::comm_impl), flag_name(&TrainConfig::reduce_dtype),
               plan_.sharded() ? "reduce-scatters" : "all-reduces");
  return opt.backend == dist::Backend::nccl ? "nccl" : "mpi";
}

// --cpu-gemm and --cpu-row-split on a CPU run: rank 0's choice of GEMM library per shape, on every rank
// (after the control communicator and the model).
void Trainer::choose_cpu_gemms() {
  CpuGemmSetup g =
      setup_cpu_gemms(cfg_.cpu_gemm, cfg_.model_config(), cfg_.image_size, cfg_.micro_batch, control_);
  cpu_gemm_note_ = std::move(g.note);
  // Under bf16 every float GEMM takes the bf16 path (precision_note_), so the library choice does not
  // apply.
  if (cpu_bf16_gemms(cfg_, false))
    cpu_gemm_note_ = fmt::format(
        "none in fp32: {} bf16 sends every GEMM to the bf16 path (next line; the fp32 "
        "choice would be {})",
        flag_name(&TrainConfig::precision), cpu_gemm_note_);
  for (const std::string& w : g.warnings) cpu_gemm_warnings_.push_back("warning: " + w);
  // Note [Cutting the rows]: process-wide, as the GEMM library; set before any kernel runs.
  const cpu::RowSplit split = *cpu::parse_row_split(cfg_.cpu_row_split);
  cpu::set_row_split(split);
  cpu_gemm_note_ +=
      fmt::format("; rows cut {} ({} {})",
                  split.mode == cpu::RowSplitMode::fast    ? "by the thread count"
                  : split.mode == cpu::RowSplitMode::fixed ? "by each layer's shape"
                                                           : fmt::format("{} at a time", split.rows),
                  flag_name(&TrainConfig::cpu_row_split), cfg_.cpu_row_split);
}

// Every rank must run the same model, stage, dtypes and batch settings (the flags marked ranks_agree in the
// flag table): a mismatch would otherwise show as a hang or as silently wrong results. Each rank contributes
// a hash of each such flag's value (52 bits, exact in an f64); every rank sees all of them and so every rank
// stops with the same message, naming the flag.
void Trainer::check_ranks_agree() {
  std::vector<const Flag*> agreed;
  for (const Flag& f : flags())
    if (f.ranks_agree) agreed.push_back(&f);
  const int64_t k = int64_t(agreed.size()), n = world_.size();
  std::vector<double> mine;
  for (const Flag* f : agreed)
    mine.push_back(double(std::hash<std::string>{}(flag_value(cfg_, *f)) & ((uint64_t(1) << 52) - 1)));
  const std::vector<double> v = control_.all_gather(mine);
  for (int64_t f = 0; f < k; ++f)
    for (int64_t r = 1; r < n; ++r)
      CZ_CHECK(v[size_t(r * k + f)] == v[size_t(f)],
               "ranks were started with different {}: rank {} differs from rank 0 (every rank must get the "
               "same flags)",
               agreed[size_t(f)]->name, r);
}

// Note [Choosing the comm backend]: NCCL moves CUDA buffers between GPUs directly, but refuses two ranks on
// one device ("Duplicate GPU detected", since NCCL 2.5). MPI stages each CUDA buffer through pinned host
// memory (a device-to-host copy, the collective on host memory, a host-to-device copy, on the communicator's
// own stream: Note [Comm streams]), which costs two PCIe crossings per call and the host's bandwidth, but
// works whatever the ranks share, and also where NCCL's transports hang (consumer PCIe boxes without P2P).
// auto takes NCCL when every rank has a GPU of its own (World gives a host's local rank i GPU i % count, so a
// host has enough when its ranks are no more than its GPUs), else MPI; CPU ranks always use MPI. Every rank
// reaches the same choice: each one's answer goes round the control communicator.
dist::Backend Trainer::choose_backend() {
  const std::string flag = flag_arg(cfg_, &TrainConfig::comm_backend);
  if (!device_.is_cuda()) {
    comm_note_ = "mpi (CPU ranks)";
    return dist::Backend::mpi;
  }
  const int gpus = cuda_device_count();
  const std::vector<double> own =
      control_.all_gather({double(world_.local_size() <= gpus), double(world_.local_size()), double(gpus)});
  int shared = -1;  // the first rank whose host has more ranks than GPUs
  for (int r = 0; r < world_.size() && shared < 0; ++r)
    if (own[size_t(3 * r)] == 0) shared = r;
  std::string why = "every rank has a GPU of its own";
  if (shared >= 0)
    why = fmt::format("{} ranks share {} GPU(s) on host {}", int(own[size_t(3 * shared + 1)]),
                      int(own[size_t(3 * shared + 2)]), world_.peer(shared).host);
  if (cfg_.comm_backend == "mpi") {
    comm_note_ = fmt::format("mpi ({}: CUDA buffers staged through pinned host memory)", flag);
    return dist::Backend::mpi;
  }
  CZ_CHECK(cfg_.comm_backend != "nccl" || shared < 0,
           "{}: {}, and NCCL refuses two ranks on one GPU; use {} mpi (or auto, which picks it)", flag, why,
           flag_name(&TrainConfig::comm_backend));
  if (cfg_.comm_backend == "nccl") {
    comm_note_ = fmt::format("nccl ({})", flag);
    return dist::Backend::nccl;
  }
  comm_note_ = shared < 0
                   ? fmt::format("nccl (auto: {})", why)
                   : fmt::format("mpi (auto: {}; CUDA buffers staged through pinned host memory)", why);
  return shared < 0 ? dist::Backend::nccl : dist::Backend::mpi;
}

// The two-level collectives over MPI move host buffers only (takes_two_levels): --comm-impl hier with CUDA
// ranks on the mpi backend is refused here, at start, rather than at the first bucket (the first GPU run
// found it there). auto and flat take the ring, which stages CUDA buffers.
void Trainer::check_comm_impl(dist::Backend backend) const {
  CZ_CHECK(
      !(backend == dist::Backend::mpi && device_.is_cuda() && cfg_.comm_impl == "hier"),
      "{}: two-level collectives over the mpi backend take host buffers, and these ranks train on {} with "
      "the collectives over {}; use {} auto or flat (the ring, which stages CUDA buffers), or {} nccl",
      flag_arg(cfg_, &TrainConfig::comm_impl), cfg_.device, comm_note_, flag_name(&TrainConfig::comm_impl),
      flag_name(&TrainConfig::comm_backend));
}

// Note [Two-hop choice]: --reduce-dtype int8, sharded over the world at stages 1-3 (no --shard-group: with
// one, the reduce-scatter already stays in its shard group) or stage 0's all-reduce, on several hosts of the
// same number (> 1) of CPU ranks, reduces in two hops (Note [Two-hop quantized reduction], Note [Two-hop
// quantized all-reduce]) with --comm-impl hier, and with auto: the two hops send as many records in all as
// the flat all-to-all (R H - 1 = N - 1 per rank), but only H - 1 of them cross hosts instead of (H - 1) R,
// and the cost model's links across hosts are never faster than those inside a host (Note [Two-level cost
// model]), so by its bytes the two hops are never slower. flat keeps the all-to-all. hier where two hops
// cannot apply on several hosts (CUDA ranks, whose kernels have not run) is refused; one host or one rank per
// host is the flat path, as for the fp32 collectives.
// The run's step plan (Note [Step plan]) on these hosts, made before the mesh, which needs the host and cross
// groups for two hops.
zero::StepPlan Trainer::make_plan(const dist::HostMap& hosts) const {
  const int shard_group =
      cfg_.shard_group == "world" ? 0 : int(dist::shard_groups(cfg_.shard_group, hosts).front().size());
  zero::StepPlan plan =
      zero::make_step_plan(zero_config(cfg_, device_), {.world = world_.size(),
                                                        .shard_group = shard_group,
                                                        .hosts = hosts.num_hosts(),
                                                        .ranks_per_host = hosts.ranks_per_host(),
                                                        .flat_impl = cfg_.comm_impl == "flat"});
  CZ_CHECK(
      plan.two_hop_choice() != zero::TwoHop::cpu_only || cfg_.comm_impl != "hier",
      "{} with {} int8 on {} hosts: the two-hop quantized reduction takes CPU ranks (this run: {} {}); use "
      "{} auto or flat for the flat all-to-all",
      flag_arg(cfg_, &TrainConfig::comm_impl), flag_name(&TrainConfig::reduce_dtype), hosts.num_hosts(),
      flag_name(&TrainConfig::device), cfg_.device, flag_name(&TrainConfig::comm_impl));
  return plan;
}

Trainer::~Trainer() = default;

void Trainer::build_model() {
  model_ = std::make_unique<nn::ConvNeXt>(cfg_.model_config(), nn::ParamOptions{DType::f32, device_});
  model_->init_weights(cfg_.seed);
  if (!cfg_.init_weights.empty()) {
    WeightImportOptions opt;
    if (cfg_.reset_head) opt.skip_prefixes = {"head.fc."};
    const WeightImportReport r = import_weights(cfg_.init_weights, model_->named_parameters(), opt);
    // Note [Class names]: a kept classifier must be for this data's classes; --reset-head makes a new one.
    if (!cfg_.reset_head)
      feed_->check_classes(r.class_names, flag_arg(cfg_, &TrainConfig::init_weights),
                           fmt::format("give {} to train a new classifier for these classes",
                                       flag_name(&TrainConfig::reset_head)));
    if (cfg_.reset_head) model_->reset_head(cfg_.seed + 1);
    init_weights_note_ = describe_import(cfg_, r);
  }
  model_->set_activation_checkpointing(cfg_.activation_checkpointing);
  zero::ZeroGroups groups{mesh_.world(),         mesh_.shard(), mesh_.replicate(), mesh_.host(),
                          mesh_.hosts().host_of, mesh_.cross(), mesh_.hosts()};
  engine_ = std::make_unique<zero::ZeroEngine>(*model_, model_->units(), std::move(groups), plan_,
                                               make_optimizer(cfg_), make_ema(cfg_));
}

void Trainer::build_schedule() {
  int64_t warmup = cfg_.warmup_steps;
  if (cfg_.warmup_epochs > 0) {
    warmup = std::llround(cfg_.warmup_epochs * double(feed_->steps_per_epoch()));
    CZ_CHECK(cfg_.schedule == "constant" || warmup <= total_steps_,
             "{} is {} steps at {} steps per epoch, more than the run's {} steps (give {} or a longer run)",
             flag_arg(cfg_, &TrainConfig::warmup_epochs), warmup, feed_->steps_per_epoch(), total_steps_,
             flag_name(&TrainConfig::warmup_steps));
  }
  schedule_ = std::make_unique<LrSchedule>(
      cfg_.schedule == "constant"
          ? constant_schedule(cfg_.lr, warmup)
          : cosine_schedule(cfg_.lr, cfg_.min_lr, std::max<int64_t>(total_steps_, 1), warmup));
  if (compute_dtype_ == DType::f16) {
    LossScalerConfig sc;
    sc.init_scale = cfg_.initial_loss_scale;
    scaler_ = LossScaler(sc);
  }
}

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
