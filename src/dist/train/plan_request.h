// The planner's requests made from the training flags: `convnext_zero --plan` and `--what-if` (apps), the
// closing summary's plan beside the measured peak, and the planner's tests. The planner reads a RunSpec
// (src/dist/plan/run_spec.h); this is where the flags become one, validated as a run validates them, and
// where the plan's checks that name flags are made.
#pragma once

#include "dist/plan/planner.h"
#include "dist/plan/run_spec.h"
#include "dist/plan/what_if.h"
#include "dist/train/config.h"

namespace cz::train {

class Trainer;
struct TrainSummary;

// The run of `cfg` as the planner reads it. Throws ValueError as TrainConfig::validate does (a config with
// neither --steps nor --epochs is taken as one step), and for --precision fp16 on the CPU.
plan::RunSpec run_spec(const TrainConfig& cfg);

// A plan of a run of `cfg` on `world` ranks, `ranks_per_host` to a host (0: all on one); the rest of the
// request as plan::PlanRequest's defaults. Throws ValueError where --shard-group does not divide the world
// into equal groups, or --hpz has one host.
plan::PlanRequest plan_request(const TrainConfig& cfg, int world = 1, int ranks_per_host = 0);

// The what-if's request for a run of `cfg`: its topology, compute table and the rest left to the caller.
// Throws ValueError where --shard-group is neither world nor host (the what-if models those two).
plan::WhatIfRequest what_if_request(const TrainConfig& cfg);

// The request whose plan a run's closing summary prints beside the measured peak: the trainer's flags, world,
// hosts and epoch length, and the steps the run took (summary.last_step - summary.steps + 1 to last_step).
plan::PlanRequest plan_request_for_run(const Trainer& trainer, const TrainSummary& summary, int rank);

}  // namespace cz::train
