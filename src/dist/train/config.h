// Everything a training run is configured by: the fields the flags of `convnext_zero` set. Each flag is
// declared once, with its check, in the flag table (flags.h), so bad input gets one clear message naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/augment/mixup.h"
#include "nn/convnext.h"
#include "tensor/dtype.h"

namespace cz::train {

// --num-classes' value for "the classes of --data": a folder's class folders, cifar10's 10, an h5 file's
// (its num_classes attribute, else the largest label + 1), synthetic's classes=.
inline constexpr int64_t kClassesOfTheData = 0;

struct TrainConfig {
  std::string recipe;  // a named recipe's values for the flags not given (dist/train/recipe.h)

  // Model.
  std::string model = "atto";
  std::vector<int64_t> depths, dims;  // custom architecture; both or neither, overriding --model's
  bool grn = false;                   // with depths/dims: ConvNeXt V2 blocks (GRN, no layer scale)
  // kClassesOfTheData (the app's default): the training data's classes, resolved when the data is opened
  // (DataFeed::DataFeed, resolve_num_classes). 10 for a config built in code.
  int64_t num_classes = 10;
  int64_t image_size = 64;
  double drop_path = 0.0;
  double layer_scale_init = 1e-6;  // each V1 block's gamma starts here (0: no layer scale; V2 has none)
  double head_init_scale = 1.0;    // head.fc's initial weight and bias are multiplied by this
  bool activation_checkpointing = false;
  std::string init_weights;    // HDF5 weights to start from
  bool reset_head = false;     // with init_weights: keep the file's head out, initialise a new one
  std::string export_weights;  // HDF5 file written at the end (timm names)

  // Checkpoints (docs/checkpoints.md).
  std::string checkpoint_dir;  // where step_N checkpoints go; empty: none
  int64_t checkpoint_every =
      0;  // steps between checkpoints (0: only at the end); one is also written at the end
  int64_t keep_checkpoints = 3;  // keep the newest K complete ones (0: all)
  bool checkpoint_sync =
      false;               // publish each periodic checkpoint before the next step, not in the background
  bool keep_best = false;  // also keep the checkpoints of the best eval top-1 (weights' and EMA's): DIR/best*
  std::string resume;      // a checkpoint folder (its latest) or one DIR/step_N to continue from
  double end_margin = 0;   // Slurm: stop with a checkpoint this many seconds before the job's end (0: off)

  // Data.
  std::string data = "synthetic";
  std::string eval_data;     // empty: the data source's own eval split, if it has one
  double eval_split = 0;     // hold this fraction of --data out as the eval set (Note [Held-out split])
  int64_t eval_every = 0;    // evaluate every N steps (0: only at the end)
  int64_t eval_batches = 0;  // limit evaluation to this many batches per rank (0: the whole set)
  bool shuffle = true;
  bool augment = false;
  std::string interpolation = "bilinear";  // the resize filter: bilinear | bicubic
  std::string aa;                          // timm's RandAugment string, e.g. rand-m9-mstd0.5-inc1; empty: off
  double reprob = 0;                       // random erasing: probability per training image (0: off)
  std::string remode = "pixel";            // random erasing's fill: const | rand | pixel
  int64_t recount = 1;                     // random erasing: at most this many boxes per image
  int loader_threads = -1;                 // -1: the cores this rank has (cores_per_rank, tensor/parallel.h)
  int64_t skip_bad_samples = 0;            // leave out up to N unusable samples, each reported (0: an error)
  std::string data_index_dir;              // wds: the shards' index files ("": beside them, else ~/.cache)
  // Mixup/CutMix with timm's flags and meanings (Note [Mixing within a micro-batch], io/augment/mixup.h).
  double mixup = 0;                  // Mixup's lam ~ Beta(A, A); 0: no Mixup
  double cutmix = 0;                 // CutMix's lam ~ Beta(A, A); 0: no CutMix
  std::string cutmix_minmax;         // "LO,HI": CutMix box sides as fractions of the image's (CutMix on)
  double mixup_prob = 1.0;           // probability a batch (pair, image) is mixed
  double mixup_switch_prob = 0.5;    // with both on: probability of CutMix rather than Mixup
  std::string mixup_mode = "batch";  // batch | pair | elem
  std::string dump_batches;          // FILE.h5: every training batch as the model saw it; FILE.png: a picture

  // Schedule and optimisation.
  int64_t steps = 0;                // optimizer steps; 0: --epochs decides (both 0: no step, as for exporting
                                    // the initial weights)
  int64_t epochs = 0;               // passes over the training set
  int64_t micro_batch = 32;         // per rank and micro-step
  int64_t grad_accum = 1;           // micro-steps per optimizer step
  std::string optimizer = "adamw";  // adamw | sgd
  double lr = 1e-3;
  double min_lr = 1e-6;
  double weight_decay = 0.05;
  double layer_decay = 1.0;  // layer-wise lr decay (Note [Layer-wise lr decay numbering]); 1: off
  double momentum = 0.9;     // sgd
  int64_t warmup_steps = 0;
  double warmup_epochs = 0;         // warmup in epochs of the training set (instead of warmup_steps)
  std::string schedule = "cosine";  // cosine | constant
  double label_smoothing = 0.0;
  double clip_grad = 0.0;  // global-norm clipping; 0: off
  double ema_decay = 0.0;  // weight EMA; 0: off

  // Execution.
  std::string precision = "fp32";     // fp32 | fp16 | bf16
  double initial_loss_scale = 65536;  // fp16: dynamic loss scaling starts here (2^16)
  std::string device = "cpu";         // cpu | cuda
  bool tf32 = false;                  // CUDA: TF32 tensor cores for fp32 matmuls
  std::string cpu_gemm = "onednn";    // auto | openblas | onednn | blis | libxsmm (Note [CPU GEMM libraries])
  std::string cpu_row_split = "fast";  // fast | fixed | rows:N (Note [Cutting the rows])
  std::string cuda_graphs = "auto";    // auto | on | off (Note [CUDA graphs for the step], graph_plan.h)
  std::string log;                     // JSON-lines log file
  std::string tensorboard;             // TensorBoard event files of the log's scalars (rank 0)
  bool comms_table = false;            // the run's collectives by kind and size at its end (comms_table.h)
  std::string trace;                   // Chrome Trace Event JSON of the steps in trace_steps (step_tracer.h)
  std::string trace_steps = "2:3";     // A:B, the first and last step traced (1-based, inclusive)
  uint64_t seed = 0;
  bool progress = true;             // progress on rank 0's stderr: a bar on a terminal, else plain lines
  double progress_interval_s = 10;  // seconds between plain progress lines
  int64_t rank_stats_every = 10;    // steps between gathers of every rank's step (Note [Every rank's step])

  // ZeRO (docs/zero.md): what is sharded across ranks, how gradients travel, stage-3 prefetch.
  int stage = 0;                      // 0: replicated, 1: + optimizer state, 2: + gradients, 3: + parameters
  double bucket_mb = 25;              // gradient bucket size (stages 0-2)
  int prefetch = 1;                   // stage 3: units gathered ahead of use
  std::string shard_group = "world";  // stages 1-3: world | host | N ranks (Note [2-D mesh]: HSDP)
  bool hpz = false;                   // stage 3: backward's gathers from host-local copies (Note [hpZ])
  std::string reduce_dtype = "fp32";  // fp32 | bf16 | fp16 | int8: the dtype gradients travel in
  std::string gather_dtype = "fp32";  // fp32 | bf16 | fp16 | int8: the parameters' all-gathers (stages 1-3)
  bool offload_optimizer = false;     // fp32 master, gradients and optimizer state in host memory, CPU update
  bool offload_overlap_step = false;  // with offload: the update of step t runs during step t+1 (stale)
  double comm_timeout_s = 300;        // a collective not done by then fails the run (Note [Failure handling])
  std::string comm_impl = "auto";     // flat | hier | auto (Note [Two-level collectives])
  std::string comm_backend = "auto";  // nccl | mpi | auto (Note [Choosing the comm backend])

  // Throws ValueError naming the first bad flag: the checks of the flag table (flags.h), in its order.
  void validate() const;
  // The architecture these flags name (--model, or --depths/--dims), with --num-classes and --drop-path.
  nn::ConvNeXtConfig model_config() const;
  // The loader's Mixup/CutMix for these flags, with --label-smoothing and --num-classes (inactive when
  // neither
  // --mixup, --cutmix nor --cutmix-minmax turns it on).
  MixConfig mix_config() const;
  int64_t global_batch(int world) const { return micro_batch * grad_accum * world; }
};

// "fp32" | "bf16" | "fp16", as --precision and --reduce-dtype spell them.
DType dtype_of_flag(const std::string& flag);

}  // namespace cz::train
