// Note [ZeRO memory model]: the bytes of model state one rank holds at each ZeRO stage, buffer by buffer as
// the ZeroEngine constructor allocates them, over the engine's own partition list (zero::plan_layout, Note
// [ZeRO partitioning]), so that the planner and the engine cannot disagree on a partition.
//
// Ψ is the parameter count after padding: the flat space of the layout, each parameter at a 16-element
// aligned offset, cut into partitions (buckets of --bucket-mb in the reduce dtype at stages 0-2, units at
// stage 3), each padded to a multiple of 16·N elements (N = 1 at stage 0), so Ψ/N is exact at stages 1-3.
//
// Per rank, fp32 (optimizer state s bytes per element: AdamW 8, SGD with momentum 4, SGD without 0):
//   stage 0: params 4Ψ   + grads 4Ψ         + state sΨ
//   stage 1: params 4Ψ   + grads 4Ψ         + state sΨ/N
//   stage 2: params 4Ψ   + grad shard 4Ψ/N  + state sΨ/N
//   stage 3: param shard 4Ψ/N + grad shard 4Ψ/N + state sΨ/N
// Mixed precision (bf16/fp16, CUDA only): the fp32 master weights (4Ψ at stage 0, a 4Ψ/N shard at 1-3) are
// separate from the 16-bit compute copy (2Ψ at stages 0-2, a 2Ψ/N shard at stage 3); gradients are 16-bit 2Ψ
// plus an fp32 master-gradient shard 4Ψ/N (4Ψ at stage 0) at stages 0-1, and an fp32 shard 4Ψ/N at 2-3.
// CPU offload (Note [CPU offload]): the fp32 master shard, the fp32 gradient shard and the optimizer state
// live in pinned host memory; the device keeps the compute copy (and the gradient buffer at stages 0-1).
// On a 2-D mesh (--shard-group, Note [2-D mesh]) N is the shard group's size, not the world's: the state is
// sharded inside the group and replicated across groups. hpZ (--hpz, Note [hpZ]) adds the secondary copies,
// the host-local slice of every unit, e_c·Ψ/R (R ranks per host, e_c the compute dtype's bytes), to the
// parameter shard. Gathers in another dtype than the compute copy's (--gather-dtype, Note [Quantized
// gathers]) keep the records of this rank's chunks, Ψ/N·(1 + 4/B) bytes for INT8 (Ψ/N·e_g cast), as
// parameters, and at stages 1-2 a separate fp32 master shard 4Ψ/N (the gathered values overwrite every chunk
// of the compute copy); with INT8, Ψ is aligned to B elements per parameter and padded to B·N per partition.
// The EMA of the weights (4Ψ at stage 0, 4Ψ/N otherwise) lives beside the master weights: on the host under
// offload (which on the CPU backend is the training device's own allocator, as it is not pinned memory).
// Gradient buckets, stage-3 gather buffers and the ring's scratch come and go during the step: the step
// replay allocates them (engine_events.h), not this table. Each buffer is one allocation, so the planner
// rounds it to the allocator's size class.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/zero/partition.h"
#include "dist/zero/step_plan.h"
#include "nn/convnext.h"
#include "tensor/dtype.h"

namespace cz::plan {

// Rows of the memory table that model state feeds.
enum class StateRow : uint8_t { parameters, master_weights, gradients, optimizer_state, ema };
const char* state_row_key(StateRow r);

struct StateBuffer {
  StateRow row;
  std::string name;  // "fp32 master shard", "exp_avg", ...
  int64_t bytes = 0;
  bool host = false;  // pinned host memory (offload), outside the training device's allocator
};

struct ZeroSpec {
  // What each rank keeps (Note [What each rank keeps] in step_plan.cpp): the shards (N: the shard group),
  // dtypes, gathers, hpZ (R: the ranks of a host), offload.
  zero::StepPlan plan;
  zero::ZeroLayout layout;          // the engine's partitions (zero_layout builds it as the engine does)
  int optimizer_state_tensors = 2;  // fp32 tensors of Ψ elements (sharded): AdamW 2, SGD 1 or 0
  bool ema = false;
  bool cpu_device = true;  // the CPU backend: host memory that is not pinned is the device's allocator
};

struct ZeroState {
  int64_t psi = 0;            // Ψ: padded elements of the whole model
  int64_t shard = 0;          // Ψ/N (Ψ at stage 0)
  int64_t max_partition = 0;  // elements of the largest partition
  std::vector<StateBuffer> buffers;
  int64_t row_bytes(StateRow r) const;       // on the device
  int64_t host_row_bytes(StateRow r) const;  // in pinned host memory
  int64_t total_bytes() const;               // on the device
  int64_t host_bytes() const;
};

// Elements of the flat buffer: each parameter's offset aligned to `align` elements (Note [Flat buffers]).
int64_t flat_numel(const std::vector<nn::ParamInfo>& params, int64_t align = 16);

// The layout ZeroEngine builds under `plan` for the model's parameters (nn::convnext_parameters,
// registration order): the same bucket size in elements (ZeroConfig::bucket_bytes of the reduce dtype), the
// same units (ParamInfo::unit, which ConvNeXt::units() hands the engine), alignment and padding.
zero::ZeroLayout zero_layout(const std::vector<nn::ParamInfo>& params, const zero::StepPlan& plan);

ZeroState zero_model_state(const ZeroSpec& spec);

}  // namespace cz::plan
