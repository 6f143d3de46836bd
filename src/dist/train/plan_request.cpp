#include "dist/train/plan_request.h"

#include "dist/train/flags.h"
#include "dist/train/graph_plan.h"
#include "dist/train/trainer.h"
#include "tensor/check.h"
#include "tensor/device.h"

namespace cz::train {

plan::RunSpec run_spec(const TrainConfig& flags) {
  TrainConfig cfg = flags;
  if (cfg.steps == 0 && cfg.epochs == 0) cfg.steps = 1;  // validate() wants a length
  cfg.validate();
  const Device device = parse_device(cfg.device);
  plan::RunSpec r;
  r.model = cfg.model_config();
  r.device = cfg.device;
  r.precision = cfg.precision;
  r.compute = compute_dtype(cfg, device.is_cuda());
  r.zero = zero_config(cfg, device);
  r.image_size = cfg.image_size;
  r.micro_batch = cfg.micro_batch;
  r.grad_accum = cfg.grad_accum;
  r.checkpointing = cfg.activation_checkpointing;
  r.soft_targets = cfg.mix_config().active();
  r.optimizer_state_tensors = cfg.optimizer == "adamw" ? 2 : cfg.momentum > 0 ? 1 : 0;
  r.ema = cfg.ema_decay > 0;
  r.shard_group = cfg.shard_group;
  r.world_algorithm = world_algorithm(cfg);
  r.comm_backend = cfg.comm_backend;
  r.loader_threads = cfg.loader_threads;
  r.steps = cfg.steps;
  r.checkpoint_dir = !cfg.checkpoint_dir.empty();
  r.checkpoint_every = cfg.checkpoint_every;
  r.checkpoint_sync = cfg.checkpoint_sync;
  // Note [CUDA graphs for the step]: the plan asks as auto would (a run with --cuda-graphs on where a
  // capture is unsafe is refused before it starts). The stage, offload and shapes are the planned row's.
  r.cuda_graphs = [cfg](const plan::RunSpec& run, int world, const std::string& comm, int64_t steps) {
    TrainConfig c = cfg;
    c.stage = run.zero.stage;
    c.offload_optimizer = run.zero.offload;
    c.micro_batch = run.micro_batch;
    c.grad_accum = run.grad_accum;
    GraphPlanInput g = graph_plan_input(c, world, comm, steps);
    g.cuda = true;
    if (g.mode == GraphMode::on) g.mode = GraphMode::automatic;
    const GraphPlan gp = plan_cuda_graphs(g);
    return plan::CudaGraphFigures{.micro_step_graphs = gp.micro_step_graphs, .capture = gp.capture};
  };
  return r;
}

plan::PlanRequest plan_request(const TrainConfig& cfg, int world, int ranks_per_host) {
  plan::PlanRequest req;
  req.run = run_spec(cfg);
  req.world = world;
  req.ranks_per_host = ranks_per_host;
  // The mesh's checks that name flags; make_plan checks the world and the hosts themselves.
  const int per_host = ranks_per_host > 0 ? ranks_per_host : world;
  if (world >= 1 && world % per_host == 0) {
    const int shard = plan::shard_group_size(cfg.shard_group, world, per_host);
    CZ_CHECK(world % shard == 0, "{} {} does not divide the {} ranks into equal groups",
             flag_name(&TrainConfig::shard_group), cfg.shard_group, world);
    CZ_CHECK(!cfg.hpz || per_host < world, "{} needs more than one host; the plan has all {} ranks on one",
             flag_name(&TrainConfig::hpz), world);
  }
  return req;
}

plan::WhatIfRequest what_if_request(const TrainConfig& cfg) {
  plan::WhatIfRequest req;
  req.run = run_spec(cfg);
  CZ_CHECK(cfg.shard_group == "world" || cfg.shard_group == "host",
           "--what-if models {} world or host, got {}", flag_name(&TrainConfig::shard_group),
           cfg.shard_group);
  return req;
}

plan::PlanRequest plan_request_for_run(const Trainer& trainer, const TrainSummary& summary, int rank) {
  plan::PlanRequest req =
      plan_request(trainer.config(), trainer.world_size(), trainer.mesh().hosts().ranks_per_host());
  req.max_micro_batch = false;
  req.rank = rank;
  req.first_step = summary.last_step - summary.steps + 1;
  req.last_step = summary.last_step;
  return req;
}

}  // namespace cz::train
