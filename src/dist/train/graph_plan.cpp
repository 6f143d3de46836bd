// The --cuda-graphs decision (Note [CUDA graphs for the step] in graph_plan.h).
#include "dist/train/graph_plan.h"

#include "dist/train/config.h"
#include "dist/train/flags.h"
#include "dist/zero/step_plan.h"
#include "tensor/check.h"

namespace cz::train {

GraphMode parse_graph_mode(const std::string& flag) {
  if (flag == "auto") return GraphMode::automatic;
  if (flag == "on") return GraphMode::on;
  if (flag == "off") return GraphMode::off;
  throw ValueError(
      fmt::format("{} {}: expected auto, on or off", flag_name(&TrainConfig::cuda_graphs), flag));
}

namespace {

// Why the micro-steps cannot be captured for `in`, or "" when they can. The first reason found, in the order
// a user would fix them.
std::string unsafe_reason(const GraphPlanInput& in) {
  if (in.trace)
    return fmt::format(
        "{} times every op with CUDA events that the host reads; a replay has no per-op events",
        flag_name(&TrainConfig::trace));
  if (in.comm == "mpi")
    return "the MPI backend's collectives run on the host (device buffers staged through pinned memory), "
           "which splits backward into a segment per gradient bucket";
  if (in.comm == "nccl")
    return "the gradient reducer decides on the host, from event queries while backward runs, when each "
           "bucket's collective starts (Note [Cross all-reduce]); a replay would not decide again";
  if (zero::stage_rules(in.stage).sharded)
    return fmt::format(
        "{} {}: the parameter gatherer's and the shard's hooks keep host-side state through forward and "
        "backward that a replay would not advance",
        flag_name(&TrainConfig::stage), in.stage);
  if (in.offload)
    return fmt::format("{}: gradients go to host memory during backward, for a host thread to update",
                       flag_name(&TrainConfig::offload_optimizer));
  if (in.drop_path > 0)
    return fmt::format(
        "{} {}: the masks are drawn from the step number, a kernel argument (a replay would repeat the "
        "captured step's masks)",
        flag_name(&TrainConfig::drop_path), in.drop_path);
  if (in.steps > 0 && in.steps <= kGraphWarmupSteps)
    return fmt::format("the run's {} step(s) end before the {} warm-up steps that precede a capture",
                       in.steps, kGraphWarmupSteps);
  return "";
}

}  // namespace

GraphPlan plan_cuda_graphs(const GraphPlanInput& in) {
  const char* flag = flag_name(&TrainConfig::cuda_graphs);
  GraphPlan plan;
  if (!in.cuda) {
    CZ_CHECK(in.mode != GraphMode::on, "{} on needs {} cuda (CUDA graphs record GPU kernels)", flag,
             flag_name(&TrainConfig::device));
    plan.reason = "the run is on the CPU";
    return plan;
  }
  if (in.mode == GraphMode::off) {
    plan.reason = fmt::format("{} off", flag);
    return plan;
  }
  const std::string why_not = unsafe_reason(in);
  if (!why_not.empty()) {
    CZ_CHECK(in.mode != GraphMode::on, "{} on: the step cannot be captured: {}; use {} auto or off", flag,
             why_not, flag);
    plan.reason = why_not;
    return plan;
  }
  plan.capture = true;
  plan.warmup_steps = kGraphWarmupSteps;
  plan.reason =
      "one rank without collectives, fixed shapes, no host reads in forward, backward and the update";
  plan.segments.push_back(
      {"step scalars", false,
       fmt::format("the host writes the step's lr and bias corrections{} into device memory the update graph "
                   "reads, with one copy before the step's graphs (Note [The optimizer's device scalars])",
                   in.loss_scaling ? " and 1 / loss scale" : "")});
  if (in.loss_scaling)
    plan.segments.push_back({"loss scale", false,
                             "fp16: the step's loss scale is written into device memory that the graph's "
                             "scaling of the loss reads (an overflow's skip is decided on the device, in the "
                             "update)"});
  plan.segments.push_back(
      {"input", false,
       "model_input reads each batch's draws from pinned host memory, so it runs eagerly; the images and "
       "targets are then copied into the graph's static input buffers"});
  const std::string body = "forward, loss, backward";
  if (in.grad_accum == 1) {
    plan.micro_step_graphs = 1;
    plan.segments.push_back(
        {"micro-step (" + body + ")", true, "fixed shapes, every input in device memory"});
  } else {
    plan.micro_step_graphs = 2;
    plan.segments.push_back(
        {fmt::format("micro-steps 1-{} ({})", in.grad_accum - 1, body), true, "one graph replayed for each"});
    plan.segments.push_back(
        {fmt::format("micro-step {} ({})", in.grad_accum, body), true,
         "a graph of its own: the last micro-step also ends the step's gradient reduction"});
  }
  if (in.last_micro_batch > 0 && in.last_micro_batch != in.micro_batch)
    plan.segments.push_back(
        {fmt::format("an epoch's last micro-batch of {} images", in.last_micro_batch), false,
         fmt::format("another shape than the graph's {}: it runs eagerly", in.micro_batch)});
  plan.segments.push_back(
      {std::string("update (") + (in.loss_scaling ? "unscale, " : "") + "norm, clip, optimizer, EMA)", true,
       "a graph of its own after the last micro-step: lr and bias corrections read from device memory, the "
       "gradient norm, the clip coefficient" +
           std::string(in.loss_scaling ? " and the overflow skip" : "") + " computed on the device"});
  plan.segments.push_back(
      {"loss read", false,
       "the step's mean loss is read on the host for the log, once the update is queued"});
  plan.segments.push_back({"step result read", false,
                           "after the step's closing synchronize, one 16-byte read of the gradient norm and "
                           "the overflow flag: the "
                           "log's grad_norm, the LossScaler's update and the optimizer's step count"});
  plan.graphs = plan.micro_step_graphs + 1;
  return plan;
}

std::string GraphPlan::note() const {
  if (!capture) return fmt::format("off ({})", reason);
  std::string captured, eager;
  for (const GraphSegment& s : segments) {
    std::string& list = s.captured ? captured : eager;
    list += (list.empty() ? "" : ", ") + s.name;
  }
  return fmt::format(
      "on ({}): forward, loss, backward and optimizer captured in {} graphs [{}] after {} warm-up steps; "
      "eager: "
      "{}",
      reason, graphs, captured, warmup_steps, eager);
}

GraphPlanInput graph_plan_input(const TrainConfig& cfg, int world, const std::string& comm, int64_t steps) {
  GraphPlanInput in;
  in.mode = parse_graph_mode(cfg.cuda_graphs);
  in.cuda = cfg.device.rfind("cuda", 0) == 0;
  in.world = world;
  in.comm = comm;
  in.stage = cfg.stage;
  in.offload = cfg.offload_optimizer;
  in.trace = !cfg.trace.empty();
  in.loss_scaling = cfg.precision == "fp16";
  in.drop_path = cfg.drop_path;
  in.grad_accum = cfg.grad_accum;
  in.micro_batch = cfg.micro_batch;
  in.steps = steps;
  return in;
}

}  // namespace cz::train
