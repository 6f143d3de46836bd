// The work of one training step op by op (the model's walk, nn::ModelSpec::walk), as the what-if model
// (what_if.h) times it: for each op the FLOPs and the least DRAM traffic it needs (inputs read and outputs
// written once), forward and backward, grouped by the modules that are ZeRO-3's units, with the parameters
// whose gradients each backward op completes (in the order their AccumulateGrad nodes run, as the step replay
// has it). Ops carry the names the op profiler gives them (Note [Op profiling]), so that a measured profile
// maps onto them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/model.h"
#include "tensor/dtype.h"

namespace cz::plan {

// How an op's time scales: matmul-like ops with their FLOPs, the rest with their bytes (the depthwise
// convolution apart: its kernels reach a different fraction of the bandwidth than elementwise ones).
enum class OpClass : uint8_t { matmul, memory, depthwise };

struct OpCost {
  const char* name = "";  // the profiler's name: "linear", "LinearBackward", "layer_norm", ...
  OpClass cls = OpClass::memory;
  double flops = 0;
  double bytes = 0;
  std::vector<std::string> grads;  // parameters whose gradients it completes, AccumulateGrad order
};

struct ModuleCost {
  std::string
      module;  // a unit: "stem", "stages.1.downsample", "stages.1.blocks.0", "head" (the loss included)
  std::vector<OpCost> forward;
  std::vector<OpCost> backward;  // in the order backward runs them; a checkpointed block's recompute first
};

// Forward order; backward runs the modules in reverse. `cuda`: the ops of a CUDA run (the CPU runs the first
// stages' MLPs as one op, mlp_as_one_op).
std::vector<ModuleCost> step_work(const nn::ModelSpec& model, int64_t image, int64_t batch, DType compute,
                                  bool checkpointing, bool cuda);

// The optimizer step over `elements` fp32 master elements (AdamW reads weight, gradient and both moments and
// writes three back; under mixed precision also the cast of the gradients and of the refreshed compute
// copy), and the zeroing of the gradient buffer at the start of the step.
OpCost optimizer_work(int64_t elements, bool mixed);
OpCost zero_grad_work(int64_t bytes);

}  // namespace cz::plan
