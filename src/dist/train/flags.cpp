// The flag table, and what is read from it: validation, the resume identity, the config JSON and the
// configurations derived from the flags. A new flag is one entry here plus the code that uses its field.
#include "dist/train/flags.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "dist/comm/mesh.h"
#include "dist/train/recipe.h"
#include "dist/train/trace_writer.h"
#include "dist/zero/schedule.h"
#include "tensor/check.h"

namespace cz::train {
namespace {

using C = const TrainConfig&;
using F = const Flag&;
using T = TrainConfig;

// "fp32" | "fp16" | "bf16"
bool is_dtype_flag(const std::string& v) {
  return v == "fp32" || v == "fp16" || v == "bf16";
}

std::vector<Flag> make_flags() {
  const std::string variants = fmt::format("{}", fmt::join(nn::convnext_variant_names(), "|"));
  // Checks run in this order; the first that fails names its flag.
  return {
      {.name = "--recipe",
       .field = &T::recipe,
       .group = kOptimGroup,
       .help = "a named recipe's values for every flag not given (the header lists them): " + recipe_names() +
               " (docs/training.md)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.recipe.empty() || find_recipe(c.recipe), "{} must be one of {}, got '{}'", f.name,
                      recipe_names(), c.recipe);
           },
       .ranks_agree = true,
       .json_key = "recipe"},
      {.name = "--model",
       .field = &T::model,
       .group = kModelGroup,
       .help = "ConvNeXt variant: " + variants,
       .check =
           [](C c, F f) {
             const auto names = nn::convnext_variant_names();
             CZ_CHECK(std::find(names.begin(), names.end(), c.model) != names.end(),
                      "{} must be one of {}, got '{}'", f.name, fmt::join(names, ", "), c.model);
           },
       .ranks_agree = true,
       .resume_identity = true,
       .resume_spelling = [](C c) { return c.depths.empty() ? c.model : std::string("custom"); },
       .json_key = "model"},
      {.name = "--depths",
       .field = &T::depths,
       .group = kModelGroup,
       .help = "custom blocks per stage, e.g. 2,2,6,2 (with --dims)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.depths.empty() == c.dims.empty(), "{} and {} go together (got {} depths and {} dims)",
                      f.name, flag_name(&T::dims), c.depths.size(), c.dims.size());
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "depths"},
      {.name = "--dims",
       .field = &T::dims,
       .group = kModelGroup,
       .help = "custom channels per stage, e.g. 40,80,160,320 (with --depths)",
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "dims"},
      {.name = "--num-classes",
       .field = &T::num_classes,
       .group = kModelGroup,
       .help = "classifier outputs; 0: the training data's classes (a folder's class folders, cifar10's 10, "
               "an h5 file's num_classes attribute or largest label + 1, synthetic's classes=)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.num_classes > 0 || c.num_classes == kClassesOfTheData,
                      "{} must be positive (or 0: the data's classes), got {}", f.name, c.num_classes);
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "num_classes"},
      {.name = "--image-size",
       .field = &T::image_size,
       .group = kModelGroup,
       .help = "square input size in pixels",
       .check = [](C c,
                   F f) { CZ_CHECK(c.image_size > 0, "{} must be positive, got {}", f.name, c.image_size); },
       .ranks_agree = true,
       .json_key = "image_size"},
      {.name = "--data",
       .field = &T::data,
       .group = kDataGroup,
       .help = "synthetic[:k=v,...] | h5:FILE | cifar10:DIR | folder:DIR",
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
      {.name = "--steps",
       .field = &T::steps,
       .group = kOptimGroup,
       .help = "optimizer steps (0: use --epochs; without --steps and --epochs: the default run)",
       .check = [](C c, F f) { CZ_CHECK(c.steps >= 0, "{} must be >= 0, got {}", f.name, c.steps); },
       .ranks_agree = true,
       .json_key = "steps"},
      {.name = "--epochs",
       .field = &T::epochs,
       .group = kOptimGroup,
       .help = "passes over the training set (when --steps is 0)",
       .check = [](C c, F f) { CZ_CHECK(c.epochs >= 0, "{} must be >= 0, got {}", f.name, c.epochs); },
       .ranks_agree = true,
       .json_key = "epochs"},
      {.name = "--micro-batch",
       .field = &T::micro_batch,
       .group = kOptimGroup,
       .help = "images per rank per micro-step",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.micro_batch > 0, "{} must be positive, got {}", f.name, c.micro_batch);
           },
       .ranks_agree = true,
       .json_key = "micro_batch"},
      {.name = "--grad-accum",
       .field = &T::grad_accum,
       .group = kOptimGroup,
       .help = "micro-steps per optimizer step",
       .check = [](C c,
                   F f) { CZ_CHECK(c.grad_accum > 0, "{} must be positive, got {}", f.name, c.grad_accum); },
       .ranks_agree = true,
       .json_key = "grad_accum"},
      {.name = "--optimizer",
       .field = &T::optimizer,
       .group = kOptimGroup,
       .help = "adamw | sgd",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.optimizer == "adamw" || c.optimizer == "sgd", "{} must be adamw or sgd, got '{}'",
                      f.name, c.optimizer);
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "optimizer"},
      {.name = "--lr",
       .field = &T::lr,
       .group = kOptimGroup,
       .help = "peak learning rate",
       .check = [](C c, F f) { CZ_CHECK(c.lr >= 0, "{} must be >= 0, got {}", f.name, c.lr); },
       .ranks_agree = true,
       .json_key = "lr"},
      {.name = "--min-lr",
       .field = &T::min_lr,
       .group = kOptimGroup,
       .help = "final learning rate of the cosine schedule",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.min_lr >= 0 && c.min_lr <= c.lr, "{} must be in [0, {}], got {}", f.name,
                      flag_name(&T::lr), c.min_lr);
           },
       .json_key = "min_lr"},
      {.name = "--weight-decay",
       .field = &T::weight_decay,
       .group = kOptimGroup,
       .help = "decoupled weight decay (not on biases and 1-D params)",
       .check = [](C c,
                   F f) { CZ_CHECK(c.weight_decay >= 0, "{} must be >= 0, got {}", f.name, c.weight_decay); },
       .json_key = "weight_decay"},
      {.name = "--layer-decay",
       .field = &T::layer_decay,
       .group = kOptimGroup,
       .help = "layer-wise lr decay D: each parameter's lr times D^(13 - its layer), ConvNeXt's official "
               "numbering (stem 0 .. head 13; --print-param-groups shows them; 1: off)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.layer_decay) && c.layer_decay > 0,
                      "{} must be a finite value > 0, got {}", f.name, c.layer_decay);
             if (c.layer_decay != 1.0) nn::check_layer_decay_numbering(c.model_config());
           },
       .ranks_agree = true,
       .resume_identity = true,
       .json_key = "layer_decay"},
      {.name = "--momentum",
       .field = &T::momentum,
       .group = kOptimGroup,
       .help = "SGD momentum",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.momentum >= 0 && c.momentum < 1, "{} must be in [0, 1), got {}", f.name, c.momentum);
           }},
      {.name = "--warmup-steps",
       .field = &T::warmup_steps,
       .group = kOptimGroup,
       .help = "linear warmup steps",
       .check = [](C c,
                   F f) { CZ_CHECK(c.warmup_steps >= 0, "{} must be >= 0, got {}", f.name, c.warmup_steps); },
       .json_key = "warmup_steps"},
      {.name = "--warmup-epochs",
       .field = &T::warmup_epochs,
       .group = kOptimGroup,
       .help =
           "linear warmup in epochs of the training set (rounded to whole steps), instead of --warmup-steps",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.warmup_epochs) && c.warmup_epochs >= 0, "{} must be >= 0, got {}",
                      f.name, c.warmup_epochs);
             CZ_CHECK(c.warmup_epochs == 0 || c.warmup_steps == 0, "give {} or {}, not both (got {} and {})",
                      flag_name(&T::warmup_steps), f.name, c.warmup_steps, c.warmup_epochs);
           },
       .ranks_agree = true,
       .json_key = "warmup_epochs"},
      {.name = "--schedule",
       .field = &T::schedule,
       .group = kOptimGroup,
       .help = "cosine | constant",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.schedule == "cosine" || c.schedule == "constant",
                      "{} must be cosine or constant, got '{}'", f.name, c.schedule);
           },
       .json_key = "schedule"},
      {.name = "--label-smoothing",
       .field = &T::label_smoothing,
       .group = kAugmentGroup,
       .help = "cross-entropy label smoothing",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 1, "{} must be in [0, 1), got {}", f.name,
                      c.label_smoothing);
           },
       .json_key = "label_smoothing"},
      {.name = "--drop-path",
       .field = &T::drop_path,
       .group = kAugmentGroup,
       .help = "stochastic depth rate of the last block",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.drop_path >= 0 && c.drop_path < 1, "{} must be in [0, 1), got {}", f.name,
                      c.drop_path);
           },
       .ranks_agree = true,
       .json_key = "drop_path"},
      {.name = "--layer-scale-init",
       .field = &T::layer_scale_init,
       .group = kModelGroup,
       .help = "initial value of each block's layer scale gamma (0: no layer scale)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.layer_scale_init) && c.layer_scale_init >= 0, "{} must be >= 0, got {}",
                      f.name, c.layer_scale_init);
           },
       .ranks_agree = true},
      {.name = "--head-init-scale",
       .field = &T::head_init_scale,
       .group = kModelGroup,
       .help = "multiply the classifier's initial weight and bias by this (fine-tuning: 0.001; applies to a "
               "head initialised here, not to one read with --init-weights)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.head_init_scale) && c.head_init_scale >= 0, "{} must be >= 0, got {}",
                      f.name, c.head_init_scale);
           },
       .ranks_agree = true},
      {.name = "--clip-grad",
       .field = &T::clip_grad,
       .group = kOptimGroup,
       .help = "global gradient-norm clipping (0: off)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.clip_grad >= 0, "{} must be >= 0 (0 disables clipping), got {}", f.name, c.clip_grad);
           },
       .ranks_agree = true,
       .json_key = "clip_grad"},
      {.name = "--ema-decay",
       .field = &T::ema_decay,
       .group = kAugmentGroup,
       .help = "EMA of weights, evaluated alongside (0: off)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.ema_decay >= 0 && c.ema_decay < 1, "{} must be in [0, 1) (0 disables EMA), got {}",
                      f.name, c.ema_decay);
           },
       .ranks_agree = true,
       .resume_identity = true,
       // Whether there is EMA state to load, not its decay: a resumed run may change the decay.
       .resume_spelling = [](C c) { return std::string(c.ema_decay > 0 ? "on" : "off"); },
       .json_key = "ema_decay"},
      {.name = "--precision",
       .field = &T::precision,
       .group = kDeviceGroup,
       .help = "fp32 | fp16 | bf16 (16-bit needs --device cuda)",
       .check =
           [](C c, F f) {
             CZ_CHECK(is_dtype_flag(c.precision), "{} must be fp32, fp16 or bf16, got '{}'", f.name,
                      c.precision);
           },
       .ranks_agree = true,
       .json_key = "precision"},
      {.name = "--initial-loss-scale",
       .field = &T::initial_loss_scale,
       .group = kDeviceGroup,
       .help =
           "fp16: the dynamic loss scale to start from (halved on overflow, doubled after 2000 clean steps)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.initial_loss_scale) && c.initial_loss_scale >= 1,
                      "{} must be a finite number >= 1, got {}", f.name, c.initial_loss_scale);
           }},
      {.name = "--activation-checkpointing",
       .field = &T::activation_checkpointing,
       .group = kDeviceGroup,
       .help = "recompute block activations in backward",
       .ranks_agree = true},
      {.name = "--device",
       .field = &T::device,
       .group = kDeviceGroup,
       .help = "cpu | cuda[:N] (N: the GPU of a single process; under mpirun each rank takes GPU local_rank "
               "mod the GPU count)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.device == "cpu" || c.device.rfind("cuda", 0) == 0,
                      "{} must be cpu or cuda[:N], got '{}'", f.name, c.device);
           }},
      {.name = "--stage",
       .field = &T::stage,
       .group = kZeroGroup,
       .help = "ZeRO stage: 0 replicated, 1 shards optimizer state, 2 also gradients, 3 also parameters",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.stage >= 0 && c.stage <= zero::kMaxStage, "{} must be 0, 1, 2 or 3, got {}", f.name,
                      c.stage);
           },
       .ranks_agree = true,
       .json_key = "stage"},
      {.name = "--bucket-mb",
       .field = &T::bucket_mb,
       .group = kZeroGroup,
       .help = "gradient bucket size in MiB (stages 0-2; at most a quarter of the model)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.bucket_mb) && c.bucket_mb > 0 && c.bucket_mb <= 1 << 16,
                      "{} must be in (0, 65536], got {}", f.name, c.bucket_mb);
           },
       .ranks_agree = true,
       .json_key = "bucket_mb"},
      {.name = "--prefetch",
       .field = &T::prefetch,
       .group = kZeroGroup,
       .help = "stage 3: how many units ahead to all-gather",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.prefetch >= 0 && c.prefetch <= zero::kMaxPrefetch, "{} must be in [0, {}], got {}",
                      f.name, zero::kMaxPrefetch, c.prefetch);
           },
       .ranks_agree = true},
      {.name = "--shard-group",
       .field = &T::shard_group,
       .group = kZeroGroup,
       .help = "stages 1-3: the ranks the model state is sharded over, replicated across the rest (HSDP): "
               "world, host (each host's ranks) or N (blocks of N consecutive ranks)",
       .check = [](C c, F f) { dist::check_shard_group(c.shard_group, f.name); },
       .ranks_agree = true,
       .json_key = "shard_group"},
      {.name = "--hpz",
       .field = &T::hpz,
       .group = kZeroGroup,
       .help = "stage 3, several hosts: keep each unit's host-local slice after its forward gather, so that "
               "backward gathers inside the host (costs 1/ranks-per-host of the model per rank)",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.hpz || c.stage == 3, "{} is for {} 3, got {} {}", f.name, flag_name(&T::stage),
                      flag_name(&T::stage), c.stage);
             CZ_CHECK(!c.hpz || c.shard_group == "world",
                      "{} shards over the world; with {} {} the shard already stays within its group", f.name,
                      flag_name(&T::shard_group), c.shard_group);
           },
       .ranks_agree = true,
       .json_key = "hpz"},
      {.name = "--reduce-dtype",
       .field = &T::reduce_dtype,
       .group = kZeroGroup,
       .help =
           "fp32 | bf16 | fp16 | int8: the dtype gradients are reduced in. int8 (without --shard-group): "
           "each rank sends the others their chunks of a bucket as blocks of 256 values with an fp32 scale "
           "each, summed in fp32 by the owner (at stage 0 the owner then sends every rank its averaged "
           "chunk the same way)",
       .check =
           [](C c, F f) {
             CZ_CHECK(is_dtype_flag(c.reduce_dtype) || reduces_int8(c),
                      "{} must be fp32, bf16, fp16 or int8, got '{}'", f.name, c.reduce_dtype);
             CZ_CHECK(!reduces_int8(c) || c.shard_group == "world", "{} int8 is for {} world", f.name,
                      flag_name(&T::shard_group));
           },
       .ranks_agree = true,
       .json_key = "reduce_dtype"},
      {.name = "--gather-dtype",
       .field = &T::gather_dtype,
       .group = kZeroGroup,
       .help = "fp32 | bf16 | fp16 | int8: what parameters are all-gathered in (stages 1-3; never wider than "
               "--precision). int8: blocks of 256 values with an fp32 scale each, quantized once per step "
               "from the fp32 master",
       .check =
           [](C c, F f) {
             CZ_CHECK(is_dtype_flag(c.gather_dtype) || c.gather_dtype == "int8",
                      "{} must be fp32, bf16, fp16 or int8, got '{}'", f.name, c.gather_dtype);
             CZ_CHECK(c.stage > 0 || c.gather_dtype == "fp32" || c.gather_dtype == c.precision,
                      "{} {} is for {} 1-3 (stage 0 gathers no parameters)", f.name, c.gather_dtype,
                      flag_name(&T::stage));
           },
       .ranks_agree = true,
       .json_key = "gather_dtype"},
      {.name = "--offload-optimizer",
       .field = &T::offload_optimizer,
       .group = kZeroGroup,
       .help = "at any --stage: fp32 master weights, gradients and optimizer state in pinned host memory, "
               "updated by the CPU bucket by bucket as gradients arrive",
       .ranks_agree = true,
       .json_key = "offload_optimizer"},
      {.name = "--offload-overlap-step",
       .field = &T::offload_overlap_step,
       .group = kZeroGroup,
       .help = "with --offload-optimizer: run step t's CPU update during step t+1 (one step stale)",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.offload_overlap_step || c.offload_optimizer, "{} needs {}", f.name,
                      flag_name(&T::offload_optimizer));
           },
       .ranks_agree = true},
      {.name = "--comm-timeout",
       .field = &T::comm_timeout_s,
       .group = kZeroGroup,
       .help = "seconds a collective may take before the run fails, naming it and the rank it waited for",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.comm_timeout_s) && c.comm_timeout_s > 0, "{} must be positive, got {}",
                      f.name, c.comm_timeout_s);
           }},
      {.name = "--comm-impl",
       .field = &T::comm_impl,
       .group = kZeroGroup,
       .help =
           "flat | hier | auto: the world's collectives as one ring, in two levels (inside each host, then "
           "across hosts), or per call whichever the topology's cost model predicts faster (on one host: "
           "the ring)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.comm_impl == "flat" || c.comm_impl == "hier" || c.comm_impl == "auto",
                      "{} must be flat, hier or auto, got '{}'", f.name, c.comm_impl);
           },
       .ranks_agree = true},
      {.name = "--comm-backend",
       .field = &T::comm_backend,
       .group = kZeroGroup,
       .help =
           "nccl | mpi | auto: what moves the collectives of CUDA ranks: NCCL, or MPI through pinned host "
           "memory (slower; works with several ranks on one GPU and where NCCL hangs); auto: NCCL when every "
           "rank has a GPU of its own, else MPI. CPU ranks always use MPI. At 1 rank, naming one runs the "
           "collectives' code paths over a communicator of one",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.comm_backend == "nccl" || c.comm_backend == "mpi" || c.comm_backend == "auto",
                      "{} must be nccl, mpi or auto, got '{}'", f.name, c.comm_backend);
             CZ_CHECK(c.comm_backend != "nccl" || c.device.rfind("cuda", 0) == 0,
                      "{} nccl needs {} cuda (NCCL moves GPU buffers; CPU ranks use mpi)", f.name,
                      flag_name(&T::device));
           },
       .ranks_agree = true},
      {.name = "--tf32",
       .field = &T::tf32,
       .group = kDeviceGroup,
       .help = "CUDA: allow TF32 tensor cores for fp32 matmuls"},
      {.name = "--cuda-graphs",
       .field = &T::cuda_graphs,
       .group = kDeviceGroup,
       .help = "auto | on | off: replay each micro-step's forward, loss and backward from a CUDA graph "
               "(auto: where the run allows it, else off with the reason in the header; on: refused, naming "
               "the reason, where it does not; docs/cuda.md)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.cuda_graphs == "auto" || c.cuda_graphs == "on" || c.cuda_graphs == "off",
                      "{} must be auto, on or off, got '{}'", f.name, c.cuda_graphs);
             CZ_CHECK(c.cuda_graphs != "on" || c.device.rfind("cuda", 0) == 0,
                      "{} on needs {} cuda (CUDA graphs record GPU kernels); {} is {}", f.name,
                      flag_name(&T::device), flag_name(&T::device), c.device);
           },
       .ranks_agree = true},
      {.name = "--init-weights",
       .field = &T::init_weights,
       .group = kModelGroup,
       .help = "HDF5 weights to start from (timm or original ConvNeXt keys)",
       .ranks_agree = true},
      {.name = "--reset-head",
       .field = &T::reset_head,
       .group = kModelGroup,
       .help =
           "with --init-weights: a new classifier of --num-classes outputs (the data's classes by default)",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.reset_head || !c.init_weights.empty(), "{} needs {}", f.name,
                      flag_name(&T::init_weights));
           }},
      {.name = "--export-weights",
       .field = &T::export_weights,
       .group = kOutputGroup,
       .help = "write the trained weights (HDF5, timm keys)"},
      {.name = "--checkpoint-dir",
       .field = &T::checkpoint_dir,
       .group = kOutputGroup,
       .help = "write sharded HDF5 checkpoints (DIR/step_N, DIR/latest) here, one at the end of the run too"},
      {.name = "--checkpoint-every",
       .field = &T::checkpoint_every,
       .group = kOutputGroup,
       .help = "steps between checkpoints (0: only at the end)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.checkpoint_every >= 0, "{} must be >= 0, got {}", f.name, c.checkpoint_every);
             CZ_CHECK(c.checkpoint_every == 0 || !c.checkpoint_dir.empty(), "{} needs {}", f.name,
                      flag_name(&T::checkpoint_dir));
           }},
      {.name = "--keep-checkpoints",
       .field = &T::keep_checkpoints,
       .group = kOutputGroup,
       .help =
           "keep the newest K complete checkpoints (older ones removed once a newer one is complete; 0: all)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.keep_checkpoints >= 0, "{} must be >= 0, got {}", f.name, c.keep_checkpoints);
           }},
      {.name = "--end-margin",
       .field = &T::end_margin,
       .group = kOutputGroup,
       .help = "in a Slurm job: stop after the step that ends less than SECONDS before the job's end time "
               "(SLURM_JOB_END_TIME, else slurmctld's), save a final checkpoint and exit 75, as on SIGUSR1, "
               "so that a job script can requeue it (docs/slurm.md); 0: off",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.end_margin >= 0, "{} must be >= 0 seconds (0: off), got {}", f.name, c.end_margin);
             CZ_CHECK(c.end_margin == 0 || !c.checkpoint_dir.empty(),
                      "{} needs {}: the stop before the job's end saves a checkpoint to resume from", f.name,
                      flag_name(&T::checkpoint_dir));
           }},
      {.name = "--keep-best",
       .field = &T::keep_best,
       .group = kOutputGroup,
       .help = "also keep the checkpoint of the best eval top-1 in DIR/best (and of the EMA's in "
               "DIR/best_ema), apart from --keep-checkpoints' rotation",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.keep_best || !c.checkpoint_dir.empty(), "{} needs {}", f.name,
                      flag_name(&T::checkpoint_dir));
           }},
      {.name = "--checkpoint-sync",
       .field = &T::checkpoint_sync,
       .group = kOutputGroup,
       .help =
           "publish each --checkpoint-every checkpoint before the next step (the step waits for the "
           "write) instead of in the background, so that a failure loses at most --checkpoint-every steps",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.checkpoint_sync || c.checkpoint_every > 0, "{} needs {}", f.name,
                      flag_name(&T::checkpoint_every));
           }},
      {.name = "--resume",
       .field = &T::resume,
       .group = kOutputGroup,
       .help = "continue from a checkpoint: DIR (its latest complete one) or DIR/step_N, at any world size "
               "and stage"},
      {.name = "--log",
       .field = &T::log,
       .group = kOutputGroup,
       .help =
           "JSON-lines log: a start record, then one object per step and per evaluation; --resume continues "
           "it (records past the checkpoint dropped), else an existing one is kept as FILE.1"},
      {.name = "--tensorboard",
       .field = &T::tensorboard,
       .group = kOutputGroup,
       .help =
           "write the log's scalars (loss, lr, grad norm, img/s, communication, memory, eval top-1/top-5) "
           "as TensorBoard event files into DIR, on rank 0: tensorboard --logdir DIR"},
      {.name = "--comms-table",
       .field = &T::comms_table,
       .group = kOutputGroup,
       .help = "at the end, print rank 0's collectives per kind and message size (count, time, algorithm and "
               "bus bandwidth in nccl-tests' units, exposed time) and write them into --log"},
      {.name = "--trace",
       .field = &T::trace,
       .group = kOutputGroup,
       .help = "write a timeline of the steps in --trace-steps to FILE (Chrome Trace Event JSON, one process "
               "per rank: ops, collectives, data wait, optimizer, checkpoint saves); open it in "
               "https://ui.perfetto.dev or chrome://tracing (docs/training.md)"},
      {.name = "--trace-steps",
       .field = &T::trace_steps,
       .group = kOutputGroup,
       .help = "A:B, the first and last step (1-based, inclusive) that --trace records",
       .check = [](C c, F f) { parse_trace_steps(c.trace_steps, f.name); },
       .ranks_agree = true},
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
      {.name = "--augment",
       .field = &T::augment,
       .group = kAugmentGroup,
       .help = "random-resized-crop and horizontal flip",
       .json_key = "augment"},
      {.name = "--loader-threads",
       .field = &T::loader_threads,
       .group = kDataGroup,
       .help = "data loader worker threads (default: the cores this rank has, its affinity mask's CPUs / "
               "the ranks on its host, as for OpenMP; 0: decode on the training thread)",
       .check =
           [](C c, F f) {
             // -1 is the default, resolved by the trainer (Trainer::Trainer) and the planner.
             CZ_CHECK(c.loader_threads >= -1, "{} must be >= 0, got {}", f.name, c.loader_threads);
           }},
      {.name = "--no-progress",
       .field = &T::progress,
       .group = kOutputGroup,
       .help = "no progress on stderr (by default a bar on a terminal, else a plain line every "
               "--progress-interval seconds)",
       .inverted = true},
      {.name = "--progress-interval",
       .field = &T::progress_interval_s,
       .group = kOutputGroup,
       .help = "seconds between plain progress lines when stderr is not a terminal (mpirun, a file)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.progress_interval_s) && c.progress_interval_s >= 0,
                      "{} must be a number of seconds >= 0, got {}", f.name, c.progress_interval_s);
           }},
  };
}

}  // namespace

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = [] {
    std::vector<Flag> t = make_flags();
    const auto augment =
        std::find_if(t.begin(), t.end(), [](const Flag& f) { return f.field == FlagField(&T::augment); });
    std::vector<Flag> more = augment_flags();
    t.insert(augment + 1, more.begin(), more.end());
    return t;
  }();
  return table;
}

const Flag& flag_of(const FlagField& field) {
  const auto& t = flags();
  const auto it = std::find_if(t.begin(), t.end(), [&](const Flag& f) { return f.field == field; });
  CZ_ASSERT(it != t.end(), "a TrainConfig field without a flag");
  return *it;
}

const Flag* find_flag(const std::string& name) {
  for (const Flag& f : flags())
    if (name == f.name) return &f;
  return nullptr;
}

void set_flag_value(TrainConfig& c, const Flag& f, const std::string& value) {
  // The whole of `text` as a number, by `parse` (std::stod and the like).
  const auto number = [&](const std::string& text, auto parse) {
    size_t used = 0;
    try {
      const auto v = parse(text, &used);
      if (used == text.size()) return v;
    } catch (const std::exception&) {
    }
    throw ValueError(fmt::format("{}: '{}' is not a number", f.name, text));
  };
  const auto stoll = [](const std::string& s, size_t* n) { return std::stoll(s, n); };
  std::visit(
      [&](auto member) {
        auto& v = c.*member;
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) {
          v = value;
        } else if constexpr (std::is_same_v<V, bool>) {
          CZ_CHECK(value == "true" || value == "false", "{}: expected true or false, got '{}'", f.name,
                   value);
          v = value == "true";
        } else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          v.clear();
          size_t b = 0;
          while (!value.empty()) {
            const size_t e = std::min(value.find(',', b), value.size());
            v.push_back(number(value.substr(b, e - b), stoll));
            if (e == value.size()) break;
            b = e + 1;
          }
        } else if constexpr (std::is_same_v<V, double>) {
          v = number(value, [](const std::string& s, size_t* n) { return std::stod(s, n); });
        } else if constexpr (std::is_same_v<V, uint64_t>) {
          v = number(value, [](const std::string& s, size_t* n) { return std::stoull(s, n); });
        } else {
          v = V(number(value, stoll));
        }
      },
      f.field);
}

std::string flag_value(const TrainConfig& c, const Flag& f) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = c.*member;
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>)
          return v;
        else if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::vector<int64_t>>)
          return fmt::format("{}", fmt::join(v, ","));
        else
          return fmt::format("{}", v);
      },
      f.field);
}

std::string flag_arg(const TrainConfig& c, const FlagField& field) {
  const Flag& f = flag_of(field);
  return fmt::format("{} {}", f.name, flag_value(c, f));
}

void TrainConfig::validate() const {
  for (const Flag& f : flags())
    if (f.check) f.check(*this, f);
}

std::vector<std::pair<std::string, std::string>> resume_identity(const TrainConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Flag& f : flags())
    if (f.resume_identity)
      out.emplace_back(f.name, f.resume_spelling ? f.resume_spelling(c) : flag_value(c, f));
  return out;
}

std::string config_json(const TrainConfig& c, int world) {
  nlohmann::json j = {{"world_size", world}};
  for (const Flag& f : flags())
    if (f.json_key) std::visit([&](auto member) { j[f.json_key] = c.*member; }, f.field);
  return j.dump();
}

nlohmann::json flags_json(const TrainConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const Flag& f : flags())
    std::visit(
        [&](auto member) {
          nlohmann::json v = c.*member;
          if (f.inverted) v = !v.template get<bool>();
          j[std::string(f.name).substr(2)] = std::move(v);
        },
        f.field);
  return j;
}

int64_t bucket_bytes(double bucket_mb) {
  return std::max<int64_t>(1, int64_t(bucket_mb * (1 << 20)));
}

DType compute_dtype(const TrainConfig& c, bool cuda) {
  const DType d = dtype_of_flag(c.precision);
  CZ_CHECK(cuda || d == DType::f32, "{} {} needs {} cuda (the CPU backend computes in fp32)",
           flag_name(&T::precision), c.precision, flag_name(&T::device));
  return d;
}

bool reduces_int8(const TrainConfig& c) {
  return c.reduce_dtype == "int8";
}

DType reduce_bucket_dtype(const TrainConfig& c) {
  return reduces_int8(c) ? DType::f32 : dtype_of_flag(c.reduce_dtype);
}

DType gather_wire_dtype(const TrainConfig& c) {
  return c.gather_dtype == "int8" ? DType::u8 : dtype_of_flag(c.gather_dtype);
}

dist::Algorithm world_algorithm(const TrainConfig& c) {
  if (c.comm_impl == "flat") return dist::Algorithm::ring;
  return c.comm_impl == "hier" ? dist::Algorithm::hier : dist::Algorithm::automatic;
}

zero::ZeroConfig zero_config(const TrainConfig& c, Device device) {
  zero::ZeroConfig z;
  z.stage = c.stage;
  z.bucket_bytes = bucket_bytes(c.bucket_mb);
  z.prefetch = c.prefetch;
  z.compute_dtype = compute_dtype(c, device.is_cuda());
  z.reduce_dtype = reduce_bucket_dtype(c);
  z.reduce_int8 = reduces_int8(c);
  z.gather_dtype = gather_wire_dtype(c);
  z.device = device;
  z.offload = c.offload_optimizer;
  z.offload_overlap_step = c.offload_overlap_step;
  z.hpz = c.hpz;
  return z;
}

}  // namespace cz::train
