// The ZeRO engine's configuration: the stage, the dtypes its buffers and collectives use, offload, hpZ and
// quantization, as the flag table fills it in (train::zero_config). StepPlan (step_plan.h) reads it with the
// mesh's facts and decides what the stage keeps and runs.
#pragma once

#include <cstdint>

#include "tensor/device.h"
#include "tensor/dtype.h"

namespace cz::zero {

struct ZeroConfig {
  int stage = 0;                     // 0-3
  int64_t bucket_bytes = 25 << 20;   // stages 0-2: gradient bucket size, in the reduce dtype
  int prefetch = 1;                  // stage 3: units all-gathered ahead of use
  DType compute_dtype = DType::f32;  // what the model runs in (f32, or bf16/f16 on CUDA)
  DType reduce_dtype = DType::f32;   // what gradients travel in
  Device device = Device::cpu();
  // CPU offload (Note [CPU offload]): fp32 master shard, gradient shard and optimizer state in pinned host
  // memory, updated by the CPU; with overlap_step the update of step t runs during step t+1 (one step stale).
  bool offload = false;
  bool offload_overlap_step = false;
  // Stage 3 (Note [hpZ] in unit_gatherer.cpp): keep each unit's host-local slice after its forward gather and
  // gather backward's copy of the unit inside the host from those slices. Needs ZeroGroups::host.
  bool hpz = false;
  // What parameters travel in when all-gathered (stages 1-3; --gather-dtype): f32, bf16 or f16 (never wider
  // than compute_dtype: the compute copy itself travels then), or u8 for INT8 blocks of quant_block values
  // (Note [Quantized gathers] in gather_codec.h). Not INT8 at stage 0, which gathers nothing.
  DType gather_dtype = DType::f32;
  // Stages 1-3, flat (no --shard-group): gradient buckets (f32, reduce_dtype) reduce-scattered as INT8
  // records of quant_block values (--reduce-dtype int8, Note [Quantized reduction] in quant_reduce.h).
  bool reduce_int8 = false;
  int64_t quant_block = 256;
  // Whether int8 reductions go in two hops is the step plan's choice from the mesh (Note [Two-hop choice],
  // make_step_plan).
};

}  // namespace cz::zero
