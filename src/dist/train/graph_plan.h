// --cuda-graphs: which parts of a training step are captured into CUDA graphs and replayed, and why the rest
// runs eagerly. A pure function of the run's flags, so the decision is tested on the CPU; the trainer's
// StepGraphs (step_graphs.h) carries it out on a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cz::train {

struct TrainConfig;

// Note [CUDA graphs for the step]
// A ConvNeXt step launches hundreds of small kernels; at batch 64 on a fast GPU the host's launches, not the
// kernels, can set the pace. A CUDA graph records the kernels of one micro-step's forward, loss and backward
// once and replays them with one launch; the optimizer update (fp16's unscale, the gradient norm, clipping,
// the optimizer, the EMA) is a graph of its own, replayed after the last micro-step, its per-step values read
// from device memory and its decisions (clip coefficient, overflow skip) taken on the device (Note [The
// optimizer's device scalars] in optim/device_scalars.h). What a replay repeats is exactly what was recorded:
// kernel arguments, device addresses, the order of streams. So a part of the step is captured only where:
//  * its shapes are the same every step (a micro-batch of another size runs eagerly, uncaptured);
//  * every value that changes from step to step lives in device memory the replay reads (the images and
//    targets are copied into the graph's static input buffers before each replay; the loss is read from its
//    static output after the replay);
//  * nothing inside it reads the device from the host or decides on the host from the device's progress (a
//    host read ends a segment: the rest of the step runs eagerly);
//  * its memory comes from a pool only the graph uses (the caching allocator's blocks of the capture stream,
//    Note [Allocations during capture] in tensor/cuda/allocator.cpp), so replays find their addresses intact.
// The plan below says, for a run's flags, whether the micro-steps are captured and which segments a step is
// made of; where something above does not hold, auto turns graphs off and says why, and `on` is refused with
// the same reason.
enum class GraphMode { automatic, on, off };
GraphMode parse_graph_mode(const std::string& flag);  // "auto" | "on" | "off" (ValueError otherwise)

// What the plan depends on, taken from the flags and the run (graph_plan_input makes it from a TrainConfig).
struct GraphPlanInput {
  GraphMode mode = GraphMode::automatic;
  bool cuda = false;             // --device cuda
  int world = 1;                 // ranks
  std::string comm;              // "" (no communicator: one rank, --comm-backend auto), "nccl" or "mpi"
  int stage = 0;                 // ZeRO stage
  bool offload = false;          // --offload-optimizer
  bool trace = false;            // --trace
  bool loss_scaling = false;     // fp16's dynamic loss scale
  double drop_path = 0;          // --drop-path
  int64_t grad_accum = 1;        // micro-steps per step
  int64_t micro_batch = 1;       // --micro-batch
  int64_t last_micro_batch = 0;  // the size of an epoch's last micro-batch where it is partial; 0: none
  int64_t steps = 0;             // the steps this process runs (0: unknown)
};

// One part of a step, in the order the step runs them.
struct GraphSegment {
  std::string name;       // "micro-step 1..3 (forward, loss, backward)", "update", ...
  bool captured = false;  // replayed from a graph, or run eagerly
  std::string why;        // why it is (not) captured
};

struct GraphPlan {
  bool capture = false;                // the micro-steps are captured and replayed
  std::string reason;                  // why not (auto or off), or why (on or auto); never empty
  std::vector<GraphSegment> segments;  // empty when nothing is captured
  int graphs = 0;                      // graphs captured: the micro-steps' and the update's
  int micro_step_graphs = 0;  // 1, or 2 with --grad-accum > 1 (the last micro-step differs); each holds a
                              // static copy of a micro-batch's input
  int warmup_steps = 0;       // eager steps on the capture stream before the capture
  // The header's line: "on (...): forward, loss, backward and optimizer captured in 2 graphs [micro-step
  // (forward, loss, backward), update (norm, clip, optimizer, EMA)] after 2 warm-up steps; eager: step
  // scalars, input, loss read, step result read" or "off (--trace ...)".
  std::string note() const;
};

// Eager steps on the capture stream before capturing: they fill its pool of blocks, create its cuBLASLt and
// cuDNN workspaces and settle every lazily chosen algorithm, so the capture allocates and times nothing.
constexpr int kGraphWarmupSteps = 2;

// The decision for `in`. With GraphMode::on where capture is unsafe: ValueError naming the reason and the
// flag.
GraphPlan plan_cuda_graphs(const GraphPlanInput& in);

// The input for a run of `cfg` over `world` ranks with the given communicator ("" none, "nccl", "mpi"); the
// epoch's last micro-batch is left 0 (the training loader drops a partial batch: DataFeed::DataFeed).
GraphPlanInput graph_plan_input(const TrainConfig& cfg, int world, const std::string& comm, int64_t steps);

}  // namespace cz::train
