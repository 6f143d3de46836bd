// Note [ZeRO memory model]: the bytes of model state one rank holds at each ZeRO stage, in one place, so that
// the planner and the ZeRO engine (which will pass its real partition list) agree.
//
// Ψ is the parameter count after padding. Parameters lie in registration order in one flat buffer, each
// offset aligned to 16 elements. The flat space is cut into partitions: at stages 0-2 buckets of consecutive
// whole parameters of up to --bucket-mb MiB in the reduce dtype (a larger parameter is a bucket of its own);
// at stage 3 units (the stem, each stages.i.downsample, each stages.i.blocks.j, the head). Each partition is
// padded to a multiple of 16·N elements, N ranks; Ψ is the sum of the padded partitions, so Ψ/N is exact.
//
// Per rank, fp32 (optimizer state s bytes per element: AdamW 8, SGD with momentum 4, SGD without 0):
//   stage 0: params 4Ψ   + grads 4Ψ         + state sΨ
//   stage 1: params 4Ψ   + grads 4Ψ         + state sΨ/N
//   stage 2: params 4Ψ   + grad shard 4Ψ/N  + state sΨ/N
//   stage 3: param shard 4Ψ/N + grad shard 4Ψ/N + state sΨ/N
// Mixed precision (bf16/fp16, CUDA only): the fp32 master weights (4Ψ at stage 0, a 4Ψ/N shard at 1-3) are
// separate from the 16-bit compute copy (2Ψ at stages 0-2, a 2Ψ/N shard at stage 3); gradients are 16-bit 2Ψ
// plus an fp32 master-gradient shard 4Ψ/N (4Ψ at stage 0) at stages 0-1, and an fp32 shard 4Ψ/N at 2-3.
// Communication: stages 2-3 keep up to 3 partition-sized bucket buffers in the reduce dtype alive (2 in
// flight + 1 filling); stages 0-1 one partition-sized cast buffer, only when the reduce dtype differs from
// the gradients'. Stage 3 gathers the unit in use plus --prefetch units ahead, in the compute dtype (the
// largest such window of consecutive units). EMA of the weights: 4Ψ at stage 0, 4Ψ/N otherwise.
// Each buffer is one allocation, so the planner can round it to the allocator's size class.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/plan/model_shapes.h"
#include "tensor/dtype.h"

namespace cz::plan {

// Rows of the memory table that model state feeds.
enum class StateRow : uint8_t {
  parameters,
  master_weights,
  gradients,
  optimizer_state,
  ema,
  comm_buffers,
  gather_buffers
};
const char* state_row_key(StateRow r);

struct StateBuffer {
  StateRow row;
  std::string name;  // "fp32 master shard", "exp_avg", ...
  int64_t bytes = 0;
};

struct ZeroSpec {
  int stage = 0;  // 0-3
  int world = 1;  // N
  // Padded partition sizes in elements, in flat order: buckets (stages 0-2) or units (stage 3), each a
  // multiple of 16·world (zero_partitions builds them; the engine passes its own).
  std::vector<int64_t> partitions;
  DType compute = DType::f32;       // f32, or bf16/f16 for mixed precision (fp32 master weights)
  DType reduce = DType::f32;        // what gradients travel in
  int prefetch = 1;                 // stage 3: units gathered ahead of the one in use
  int optimizer_state_tensors = 2;  // fp32 tensors of Ψ elements (sharded): AdamW 2, SGD 1 or 0
  bool ema = false;
  // Hook for offloading optimizer state and master weights to the host; that mode is not built yet, and
  // zero_model_state refuses it rather than guess its layout.
  bool offload = false;
};

struct ZeroState {
  int64_t psi = 0;            // Ψ: padded elements of the whole model
  int64_t shard = 0;          // Ψ/N
  int64_t max_partition = 0;  // elements of the largest partition
  std::vector<StateBuffer> buffers;
  int64_t row_bytes(StateRow r) const;
  int64_t total_bytes() const;
};

// Multiple of 16·world elements that holds n.
int64_t pad_partition(int64_t n, int world);

// The partitions of Note [ZeRO memory model] for `params` (registration order), padded.
std::vector<int64_t> zero_partitions(const std::vector<ParamInfo>& params, int stage, double bucket_mb,
                                     DType reduce, int world);

ZeroState zero_model_state(const ZeroSpec& spec);

}  // namespace cz::plan
