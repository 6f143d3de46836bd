// The ZeRO engine: owns a model's parameters, gradients, optimizer state, EMA and their shards across ranks,
// and the collectives that keep them consistent. Stage 0 (replicated, bucketed all-reduce) is one of its
// modes, so Trainer::step reads: batch -> forward -> loss -> engine.backward -> engine.step. See
// docs/zero.md, Note [ZeRO partitioning] (partition.h) and Note [ZeRO step] (engine.cpp).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dist/comm/communicator.h"
#include "dist/zero/partition.h"
#include "nn/module.h"
#include "optim/ema.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace cz::zero {

struct ZeroConfig {
  int stage = 0;                     // 0-3
  int64_t bucket_bytes = 25 << 20;   // stages 0-2: gradient bucket size, in the reduce dtype
  int prefetch = 1;                  // stage 3: units all-gathered ahead of use
  DType compute_dtype = DType::f32;  // what the model runs in (f32, or bf16/f16 on CUDA)
  DType reduce_dtype = DType::f32;   // what gradients travel in
  Device device = Device::cpu();
  std::string optimizer = "adamw";  // adamw | sgd
  double weight_decay = 0.05;       // timm's rule: not on biases and 1-D parameters
  double momentum = 0.9;            // sgd
  double ema_decay = 0;             // 0: no EMA
  // CPU offload (Note [CPU offload]): fp32 master shard, gradient shard and optimizer state in pinned host
  // memory, updated by the CPU; with overlap_step the update of step t runs during step t+1 (one step stale).
  bool offload = false;
  bool offload_overlap_step = false;
};

struct ZeroStepStats {
  double grad_norm = 0;    // global L2 norm of the averaged, unscaled gradient, before clipping
  bool skipped = false;    // fp16 overflow on some rank: no rank updated
  int64_t comm_bytes = 0;  // bytes this rank sent in the step's collectives (ring algorithms' count)
  double comm_s = 0;       // time the step's collectives ran (0 where the backend does not time them)
  // Note [Exposed communication]: the part of comm_s during which the host was waiting for a collective, so
  // 0 <= comm_exposed_s <= comm_s; comm_wait_s is all the time the host waited, which also holds the hand-off
  // to the communication thread and the wake-ups.
  double comm_exposed_s = 0;
  double comm_wait_s = 0;
  int64_t comm_buffer_bytes = 0;  // peak bytes of gradient buckets and stage-3 gather buffers in the step
  // Offload: time the worker spent copying gradients to the host and in the CPU optimizer (and EMA), and time
  // the step waited for it.
  double offload_copy_s = 0, offload_optimizer_s = 0, offload_wait_s = 0;
};

class ZeroEngine {
 public:
  // `units`: stage 3's units, module names of `model` (every parameter in exactly one; ConvNeXt::units()).
  // `comm`: null for a world of one. Every rank must construct the engine with the same model and config;
  // rank 0's initial weights are broadcast to the others.
  ZeroEngine(nn::Module& model, const std::vector<std::string>& units, dist::Communicator* comm,
             ZeroConfig cfg);
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // Starts an optimizer step: gradients (and the step's statistics) back to zero. The step's learning rate
  // and clipping are given up front, so that offload can update each range as soon as its gradient arrives.
  void begin_step(double lr, double clip_grad, const LossScaler& scaler);
  // Backward of one micro-step's (scaled) loss; gradients are reduced bucket by bucket while it runs (stages
  // 0-1: on the last micro-step only, stages 2-3: every micro-step, into the gradient shard).
  void backward(const Tensor& loss, bool last_micro_step);
  // After the last backward: unscale and overflow check (fp16), global norm, clipping, the optimizer on this
  // rank's shard, EMA, and the compute copy brought up to date (all-gathered at stages 1-2).
  ZeroStepStats step(LossScaler& scaler);
  // Waits for everything in flight and brings the compute copy up to date with the latest update (offload's
  // delayed update included): before evaluation, export or checkpoints.
  void synchronize();

  // Sum (or mean) of a scalar over ranks; the value itself for a world of one.
  double all_reduce_scalar(double v, bool average);
  // Exchanges the live weights with the EMA weights (for evaluation); call again to swap back.
  void swap_ema();
  bool has_ema() const { return ema_ != nullptr; }

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
  int64_t ema_bytes() const;
  const ZeroLayout& layout() const { return layout_; }
  Optimizer& optimizer() { return *optimizer_; }

  // Stage 3: whether partition p's parameters are gathered (or being gathered) now, and the bytes gathered.
  bool unit_resident(size_t p) const;
  int64_t gathered_bytes() const;

 private:
  enum class Phase { forward, backward };
  enum class Gather { released, gathering, resident };
  struct InFlight {
    size_t partition;
    dist::WorkHandle work;
    Tensor buffer;  // what the collective reduces (a bucket, or a view of the full gradient buffer)
  };

  void build_buffers(const std::vector<std::pair<std::string, Tensor>>& named);
  void install_hooks(nn::Module& model);
  void on_grad_ready(size_t param, Tensor& p);
  void launch_reduce(size_t p);
  void finish_oldest();
  void flush();
  void wait(const dist::WorkHandle& w);
  void count_sent(int64_t bytes, int collectives_factor);
  void note_comm_buffers();

  // Stage 3 (Note [Stage-3 units] in engine_units.cpp).
  void gather(size_t p);
  void use(size_t p);
  void release(size_t p);
  void prefetch_after(size_t p, bool backward);
  void on_unit_forward_pre(size_t p);
  void on_unit_forward_post(size_t p);
  void on_unit_backward_pre(size_t p);

  // Offload (engine_offload.cpp).
  void offload_grad_chunk(size_t p, const Tensor& chunk, bool accumulate);
  void offload_step(LossScaler& scaler);

  void wait_param_gathers(std::span<const size_t> partitions);
  void wait_all_param_gathers();

  std::vector<Tensor> master_params() const;
  std::vector<Tensor> master_grads() const;
  Tensor compute_chunk(size_t p) const;
  void refresh_compute();
  double global_grad_norm(const std::vector<Tensor>& grads);
  // fp16 unscale and the all-rank overflow decision, the global norm, clipping: whether to take the step.
  bool prepare_gradients(const std::vector<Tensor>& grads, LossScaler& scaler);

  ZeroConfig cfg_;
  dist::Communicator* comm_;
  int rank_ = 0, world_ = 1;
  int shard_rank_ = 0;  // which chunk this rank owns: its rank, or 0 at stage 0 (one chunk, replicated)
  ZeroLayout layout_;
  std::vector<std::pair<std::string, Tensor>> named_;
  std::vector<size_t> param_partition_;

  Tensor params_;       // stages 0-2: the full compute copy the model runs on
  Tensor grads_;        // stages 0-1: the full gradient buffer (compute dtype) the .grads view
  Tensor param_shard_;  // stage 3: this rank's chunks of the compute copy
  Tensor grad_shard_;   // fp32 gradient chunks (stages 2-3, and under mixed precision)
  Tensor master_;       // fp32 master chunks under mixed precision
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<WeightEma> ema_;

  // Per partition.
  std::vector<int> remaining_;    // gradients still to arrive in this backward
  std::vector<bool> launched_;    // reduced in this backward
  std::vector<Tensor> buckets_;   // stages 2-3: the partition's gradients, filled by the hooks
  std::vector<Tensor> gathered_;  // stage 3: the full unit, its storage released between uses
  std::vector<Gather> gather_state_;
  std::vector<dist::WorkHandle> gather_work_;
  std::deque<InFlight> in_flight_;
  // Stages 1-2: the all-gathers of updated parameters, launched after the step and waited for by the next
  // forward, module by module (Note [Overlapped parameter all-gather]).
  std::vector<dist::WorkHandle> param_gather_;

  Phase phase_ = Phase::forward;
  bool last_micro_ = true;
  bool recording_ = true;      // stage 3: the first forward records the unit order
  std::vector<size_t> order_;  // units in forward order
  std::vector<size_t> position_;

  std::unique_ptr<class HostWorker> worker_;
  std::vector<bool> host_grad_fresh_;  // offload: the partition's host gradient not yet written this step
  bool eager_update_ = false;          // offload: each range updated as soon as its gradient is on the host
  bool update_pending_ = false;        // offload_overlap_step: an update not yet copied to the device
  std::atomic<double> copy_s_{0}, optim_s_{0};
  double lr_ = 0, clip_grad_ = 0;

  std::vector<dist::WorkHandle> step_works_;  // waited for in this step: their run times are its comm_s
  std::vector<std::pair<dist::Work::TimePoint, dist::Work::TimePoint>> step_waits_;  // the host's waits
  void collect_comm_times();

  ZeroStepStats stats_;
  int64_t comm_buffer_now_ = 0;
  std::vector<std::pair<int, int>> param_hooks_;           // (param index, hook id)
  std::vector<std::pair<nn::Module*, int>> module_hooks_;  // (module, hook id)
};

}  // namespace cz::zero
