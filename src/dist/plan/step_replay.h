// The allocations of one training step of a model (nn::ModelSpec), replayed through a MemoryEvents: the model
// build (for the allocator's cache), the model-state buffers, then steps of batch -> forward -> loss ->
// backward -> optimizer, each op allocating and freeing exactly what its code in src/tensor/ops and src/nn
// does, and each tensor saved for backward living until its node has run (Note [What a step allocates] in
// step_replay.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/plan/engine_events.h"
#include "dist/plan/memory_events.h"
#include "dist/plan/zero_memory.h"
#include "nn/model.h"

namespace cz::plan {

struct StepSpec {
  std::shared_ptr<const nn::ModelSpec> model;  // with num_classes and drop_path_rate as trained
  int64_t image_size = 64;
  int64_t micro_batch = 32;
  int64_t grad_accum = 1;      // micro-steps per step (two are enough to replay: the rest repeat the second)
  DType compute = DType::f32;  // f32, or bf16/f16 on CUDA
  bool checkpointing = false;
  bool cuda = false;
  // Batches the data loader holds on the training device besides the one in use: its prefetch window on the
  // CPU backend (loader threads x 2), none on CUDA (those live in host memory).
  int64_t prefetched_batches = 0;
  std::vector<StateBuffer> state;  // model state (zero_model_state), allocated after the build (not host)
  // --checkpoint-dir on the CPU backend: the host copy a background save makes of this rank's share of the
  // state (checkpoint_save.cpp copy_to_host), in the training device's allocator and alive through the
  // steps after the save until its writer finishes: planned as alive through the traced steps. 0: none.
  int64_t checkpoint_copy_bytes = 0;
  // Mixup/CutMix on: each batch also carries (n, num_classes) f32 soft targets, which the loss reads instead
  // of the labels (soft_target_cross_entropy: it keeps them and an f32 row sum besides the log-sum-exp).
  bool soft_targets = false;
  // --cuda-graphs (Note [CUDA graphs for the step]): graphs captured, each holding a static copy of one
  // micro-batch's images (compute dtype) and targets, and its loss, from the capture on. fp16 on CUDA also
  // keeps its loss scale in a device scalar.
  int graphs = 0;
  // The update is captured too: its device scalars (Note [The optimizer's device scalars]) and overflow flag.
  bool device_scalars = false;
  EngineSpec engine;  // the ZeRO engine: stage, ranks, partitions (engine_events.h)
  int steps = 1;      // >1 to let the allocator's cache reach its steady state
};

struct StepReplay {
  TraceSnapshot peak;  // over the steps (the build is not counted, as Trainer::step resets the peak)
  std::vector<int64_t> saved_end_of_forward;  // requested bytes saved for backward, by network part
  int64_t reserved_peak = 0;                  // bytes the cache took from the system, build included
  std::vector<std::string> labels;            // TraceSnapshot::where indexes this
  std::vector<LiveBuffer> at_peak;            // with capture_event: the live buffers then
  // With log_events: every alloc and release of the traced steps (the build's are not logged), and the index
  // of each step's first event (Note [One step, two descriptions] in step_replay.cpp).
  std::vector<TraceEvent> events;
  std::vector<size_t> step_begins;
};

// `capture_event`: a TraceSnapshot::event of an earlier run with the same spec, whose live buffers to list.
StepReplay replay_step(const StepSpec& spec, int64_t capture_event = -1, bool log_events = false);

}  // namespace cz::plan
