// The run a plan is for, as the planner and the what-if read it: the model, the shapes of a step, the ZeRO
// config and how the ranks communicate. It holds what the training flags decide, not the flags: the
// trainer's side makes it from a TrainConfig (run_spec in train/plan_request.h, which validates the flags as
// a run does), so that plan/ stands on nn/ and zero/ and not on train/.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dist/comm/types.h"
#include "dist/zero/zero_config.h"
#include "nn/convnext.h"
#include "tensor/dtype.h"

namespace cz::plan {

// What the step captures in CUDA graphs (Note [CUDA graphs for the step]) for the planner's replay.
struct CudaGraphFigures {
  int micro_step_graphs = 0;  // graphs of micro-steps, whose static inputs the replay holds
  bool capture = false;       // the step is captured: its scalars live in device memory
};

struct RunSpec;
// The CUDA graphs a run captures on `world` ranks over the communicator `comm` ("" none, "nccl", "mpi") for
// `steps` steps (0: a run long enough to capture). Set by run_spec in train/plan_request.h (the graph plan is
// the trainer's, train/graph_plan.h); empty: nothing captured.
using CudaGraphsOf =
    std::function<CudaGraphFigures(const RunSpec& run, int world, const std::string& comm, int64_t steps)>;

struct RunSpec {
  nn::ConvNeXtConfig model;
  std::string device = "cpu";      // "cpu" or "cuda[:N]"
  std::string precision = "fp32";  // --precision, as the plan reports it
  DType compute = DType::f32;      // what the model runs in on `device`
  // The ZeRO engine's config: stage, offload, prefetch, gather and reduce dtypes, hpZ. Its stage and offload
  // are the run's; the planner sets them per row.
  zero::ZeroConfig zero;
  int64_t image_size = 224, micro_batch = 32, grad_accum = 1;
  bool checkpointing = false;       // activation checkpointing
  bool soft_targets = false;        // mixup or cutmix: the targets are a batch of class probabilities
  int optimizer_state_tensors = 2;  // AdamW's two moments, SGD's momentum or nothing
  bool ema = false;                 // an EMA of the weights
  // How the ranks communicate: the shard group ("world", "host" or a count of ranks), the world's algorithm
  // (--comm-impl) and the backend ("auto", "mpi" or "nccl").
  std::string shard_group = "world";
  dist::Algorithm world_algorithm = dist::Algorithm::automatic;
  std::string comm_backend = "auto";
  int loader_threads = -1;  // -1: as the trainer resolves it for the ranks on a host
  // The run's length and its checkpoints (Note [What a run holds that a step does not decide]).
  int64_t steps = 0;            // 0: by epochs
  bool checkpoint_dir = false;  // --checkpoint-dir: the run saves checkpoints
  int64_t checkpoint_every = 0;
  bool checkpoint_sync = false;
  CudaGraphsOf cuda_graphs;  // empty: nothing captured
};

// The ranks of a shard group ("world", "host" or a count) in a world of `world` ranks, `per_host` to a host.
int shard_group_size(const std::string& shard_group, int world, int per_host);

}  // namespace cz::plan
