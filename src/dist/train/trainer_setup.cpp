// The Trainer's setup, in the constructor's order: the device, the communicators with the mesh and the step
// plan, the checkpointer and the stop agreement, the data feed, the model and its engine, the CPU GEMMs, the
// schedule, a resume, the log, the tracer and the CUDA graphs.
#include <chrono>
#include <cmath>
#include <functional>
#include <utility>

#include "dist/train/cpu_gemm_setup.h"
#include "dist/train/flags.h"
#include "dist/train/param_groups.h"
#include "dist/train/trainer.h"
#include "io/checkpoint/weights.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/cpu/gemm_bf16.h"
#include "tensor/cpu/row_tiles.h"
#include "tensor/cuda/runtime.h"
#if CZ_WITH_CUDA
#include "tensor/cuda/context.h"
#endif
#include "tensor/ops.h"

namespace cz::train {
namespace {

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
    tracer_->watch_blocks(*model_, model_->units(), plan_.unit_gathers());
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

}  // namespace cz::train
