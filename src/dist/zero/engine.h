// The ZeRO engine: a model's parameters, gradients, optimizer state and EMA, and their shards across the
// ranks of a process group, kept by four parts, each owning its state: the gradient reducer (buckets reduced
// from grad-ready hooks while backward runs), the parameter gatherer (stages 1-3), the sharded optimizer
// state (the optimizer and EMA the trainer builds) and, under offload, the offload worker. Stage 0
// (replicated, bucketed all-reduce) is one of its modes, so Trainer::step reads: batch -> forward -> loss ->
// engine.backward -> engine.step. See docs/zero.md, Note [ZeRO partitioning] (partition.h) and Note [ZeRO
// step] (engine.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/comm/mesh.h"
#include "dist/comm/process_group.h"
#include "dist/zero/chunk_gatherer.h"
#include "dist/zero/comm_meter.h"
#include "dist/zero/gather_codec.h"
#include "dist/zero/grad_reducer.h"
#include "dist/zero/offload.h"
#include "dist/zero/partition.h"
#include "dist/zero/sharded_state.h"
#include "dist/zero/step_plan.h"
#include "dist/zero/step_stats.h"
#include "dist/zero/unit_gatherer.h"
#include "dist/zero/zero_config.h"
#include "nn/module.h"

namespace cz::zero {

// The process groups the engine communicates in (Note [2-D mesh] in dist/comm/mesh.h, Note [ZeRO step]).
// Flat: shard = world, replicate and host groups of one.
struct ZeroGroups {
  dist::ProcessGroup world;  // stage 0's all-reduce, rank 0's initial weights
  dist::ProcessGroup shard;  // stages 1-3: the model state is sharded over it ...
  dist::ProcessGroup
      replicate;             // ... and replicated over it: each reduced gradient chunk is all-reduced here
  dist::ProcessGroup host;   // hpZ: this rank's host, where backward's gathers stay
  std::vector<int> host_of;  // the host of each world rank (StepStats::comm_cross_bytes); empty: one host
  dist::ProcessGroup
      cross;            // two hops (StepPlan::two_hop): the ranks with this rank's local index on every host
  dist::HostMap hosts;  // two hops: the launch's hosts
  static ZeroGroups flat(const dist::ProcessGroup& world);
};

class ZeroEngine {
 public:
  // `units`: stage 3's units, module names of `model` (every parameter in exactly one; ConvNeXt::units()).
  // `group`: the ranks the model is trained across (a group of one: no communication). Every rank must
  // construct the engine with the same model and config; rank 0's initial weights are broadcast to the
  // others. `make_optimizer` and `make_ema` (empty: no EMA) build the optimizer and the EMA over this rank's
  // shard once the engine has laid it out.
  ZeroEngine(nn::Module& model, const std::vector<std::string>& units, const dist::ProcessGroup& group,
             ZeroConfig cfg, const MakeOptimizer& make_optimizer, const MakeEma& make_ema = {});
  // On a mesh: `plan` (make_step_plan of the config and this mesh) shards the state over `groups.shard` and
  // replicates it over `groups.replicate`.
  ZeroEngine(nn::Module& model, const std::vector<std::string>& units, ZeroGroups groups, StepPlan plan,
             const MakeOptimizer& make_optimizer, const MakeEma& make_ema = {});
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // Starts an optimizer step: gradients (and the step's statistics) back to zero. The step's learning rate
  // and clipping are given up front, so that offload can update each range as soon as its gradient arrives.
  void begin_step(double lr, double clip_grad, const LossScaler& scaler);
  // Backward of one micro-step's (scaled) loss; the reducer's hooks reduce gradients bucket by bucket while
  // it runs (stages 0-1: on the last micro-step only, stages 2-3: every micro-step, into the gradient shard).
  void backward(const Tensor& loss, bool last_micro_step);
  // After the last backward: unscale and overflow check (fp16), global norm, clipping, the optimizer on this
  // rank's shard, EMA, and the compute copy brought up to date (the gatherer all-gathers it at stages 1-2).
  // Fills in the engine's figures of `s`.
  void step(LossScaler& scaler, StepStats& s);
  // step() split for a CUDA graph (Note [The optimizer's device scalars] in optim/device_scalars.h; one CUDA
  // rank at stage 0 without offload): after use_device_update(), every begin_step uploads the step's scalars,
  // device_update() queues the whole update without reading the device from the host (what a graph
  // captures), and finish_device_update(), after the step's closing synchronize, reads the norm and the
  // overflow flag and fills in `s` as step() does.
  void use_device_update();
  bool device_update_on() const { return state_->device_scalars(); }
  void device_update(bool loss_scaling);
  void finish_device_update(LossScaler& scaler, StepStats& s);
  // Waits for everything in flight and brings the compute copy up to date with the latest update (offload's
  // delayed update included): before evaluation, export or checkpoints.
  void synchronize();

  // Exchanges the live weights with the EMA weights (for evaluation); call again to swap back.
  void swap_ema();
  bool has_ema() const { return state_->ema() != nullptr; }

  // The full fp32 master weights under their names, on every rank (all-gathered at stages 1-3; what
  // --export-weights writes). Costs one full fp32 copy of the model on each rank while it lives.
  std::vector<std::pair<std::string, Tensor>> master_parameters();

  // Per-element state this rank owns, for checkpoints (Note [ZeRO partitioning]): for "params" (the fp32
  // master weights), each optimizer state ("exp_avg", "exp_avg_sq" or "momentum_buffer") and "ema", the flat
  // ranges this rank owns and views of their values (f32; on the host under offload). Saving: at stage 0
  // every rank holds everything, so only rank 0 reports (for_save); loading: every rank gets all its ranges
  // and overwrites the views, then calls after_load.
  struct OwnedChunk {
    ShardRange range;
    Tensor values;
  };
  std::vector<std::pair<std::string, std::vector<OwnedChunk>>> owned_state(bool for_save);
  // After a load into owned_state(false): the optimizer's step count, and the compute copy made current.
  void after_load(int64_t optimizer_steps);

  // Master weights, gradients (and their shard), optimizer state and the compute copy this rank holds on its
  // device, in bytes as the allocator holds them; what offload keeps in host memory, and the EMA, separately.
  int64_t model_state_bytes() const;
  int64_t host_state_bytes() const;
  // This rank's collectives of every step so far, by kind and size (CommMeter::table).
  const dist::CommsTable& comms_table() const { return meter_.table(); }
  int64_t ema_bytes() const { return state_->ema_bytes(); }
  const ZeroLayout& layout() const { return layout_; }
  Optimizer& optimizer() { return state_->optimizer(); }

  // Stage 3: whether partition p's parameters are gathered (or being gathered) now, and the bytes gathered.
  bool unit_resident(size_t p) const { return gatherer_ && gatherer_->resident(p); }
  int64_t gathered_bytes() const { return gatherer_ ? gatherer_->gathered_bytes() : 0; }

 private:
  // The constructor's steps, in the order the buffers are allocated (the planner replays it: Note [What the
  // engine allocates]); `Build` carries what one step hands the next.
  struct Build;
  void check_config() const;
  void lay_out(const Build& b, const std::vector<std::string>& units);
  void build_parameters(Build& b, nn::Module& model);
  void build_gradients(Build& b);
  void build_state(Build& b, const MakeOptimizer& make_optimizer, const MakeEma& make_ema);
  void build_chunk_gatherer(Build& b, nn::Module& model, const std::vector<std::string>& units);
  void refresh_compute();

  ZeroGroups groups_;
  StepPlan plan_;          // Note [Step plan]: what this stage keeps and runs
  const ZeroConfig& cfg_;  // plan_'s
  ZeroLayout layout_;
  std::unique_ptr<StepSchedule> schedule_;  // its schedules, driven by the reducer's and gatherer's hooks
  Tensor params_;                           // stages 0-2: the full compute copy the model runs on
  std::vector<Tensor> compute_chunks_;      // this rank's chunk of each partition of the compute copy
  CommMeter meter_;
  std::unique_ptr<ShardedState> state_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ParamGatherer> gatherer_;  // stages 1-3
  std::unique_ptr<OffloadWorker> offload_;   // --offload-optimizer
};

}  // namespace cz::zero
