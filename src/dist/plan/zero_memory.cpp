// Note [ZeRO memory model] (zero_memory.h): the engine's partitions and the per-rank model-state buffers.
#include "dist/plan/zero_memory.h"

#include <algorithm>

#include <fmt/format.h>

#include "dist/train/flags.h"
#include "dist/zero/gather_codec.h"
#include "dist/zero/step_plan.h"
#include "tensor/check.h"

namespace cz::plan {

const char* state_row_key(StateRow r) {
  switch (r) {
    case StateRow::parameters:
      return "parameters";
    case StateRow::master_weights:
      return "master_weights";
    case StateRow::gradients:
      return "gradients";
    case StateRow::optimizer_state:
      return "optimizer_state";
    case StateRow::ema:
      return "ema";
  }
  return "?";
}

int64_t ZeroState::row_bytes(StateRow r) const {
  int64_t n = 0;
  for (const StateBuffer& b : buffers) n += b.row == r && !b.host ? b.bytes : 0;
  return n;
}

int64_t ZeroState::host_row_bytes(StateRow r) const {
  int64_t n = 0;
  for (const StateBuffer& b : buffers) n += b.row == r && b.host ? b.bytes : 0;
  return n;
}

int64_t ZeroState::total_bytes() const {
  int64_t n = 0;
  for (const StateBuffer& b : buffers) n += b.host ? 0 : b.bytes;
  return n;
}

int64_t ZeroState::host_bytes() const {
  int64_t n = 0;
  for (const StateBuffer& b : buffers) n += b.host ? b.bytes : 0;
  return n;
}

int64_t flat_numel(const std::vector<nn::ParamInfo>& params, int64_t align) {
  int64_t n = 0;
  for (const nn::ParamInfo& p : params) n += (p.numel + align - 1) / align * align;
  return n;
}

zero::ZeroLayout zero_layout(const std::vector<nn::ParamInfo>& params, int stage, int world, double bucket_mb,
                             DType reduce, int64_t align, int pad_ranks) {
  CZ_CHECK(bucket_mb > 0, "zero_layout: the bucket size must be positive, got {} MiB", bucket_mb);
  const int64_t bucket_bytes = train::bucket_bytes(bucket_mb);  // as the trainer's ZeroConfig has it
  std::vector<zero::ParamShape> shapes;
  std::vector<std::string> unit_of;
  int64_t numel = 0;
  for (const nn::ParamInfo& p : params) {
    shapes.push_back({p.name, p.shape});
    numel += shape_numel(p.shape);
    if (zero::stage_rules(stage).unit_gathers) unit_of.push_back(p.unit);
  }
  return zero::plan_layout(shapes, stage, world,
                           zero::bucket_elems(double(bucket_bytes), dtype_size(reduce), numel), unit_of,
                           align, pad_ranks);
}

ZeroState zero_model_state(const ZeroSpec& s) {
  CZ_CHECK(s.world >= 1, "ZeRO memory model: world must be >= 1, got {}", s.world);
  CZ_CHECK(!s.layout.partitions.empty(), "ZeRO memory model: no partitions");
  const zero::StageRules rules = zero::stage_rules(s.stage);
  CZ_CHECK(s.layout.shards == (rules.sharded ? s.world : 1),
           "ZeRO memory model: a layout of {} shards for stage {} on {} ranks", s.layout.shards, s.stage,
           s.world);
  ZeroState z;
  z.psi = s.layout.flat.numel;
  z.shard = s.layout.shard_numel();
  for (const zero::Partition& p : s.layout.partitions) z.max_partition = std::max(z.max_partition, p.numel);
  const bool mixed = s.compute != DType::f32;
  const int64_t ec = int64_t(dtype_size(s.compute));
  const int64_t psi = z.psi, shard = z.shard;
  auto add = [&](StateRow row, std::string name, int64_t bytes, bool host) {
    if (bytes > 0) z.buffers.push_back({row, std::move(name), bytes, host});
  };
  const bool off = s.offload;
  const char* shard_name = rules.sharded ? " shard" : "";

  // The ZeroEngine constructor: the compute copy (full at stages 0-2, this rank's chunks at stage 3).
  if (!rules.unit_gathers)
    add(StateRow::parameters, mixed ? "16-bit compute copy" : "flat parameters", psi * ec, false);
  else
    add(StateRow::parameters, mixed ? "16-bit parameter shard" : "parameter shard", shard * ec, false);
  // hpZ: the secondary copies, the host-local slice of every unit (UnitGatherer, after the shard).
  if (rules.unit_gathers && s.hpz_ranks_per_host > 0) {
    int64_t n = 0;
    for (const zero::Partition& p : s.layout.partitions) n += p.numel / s.hpz_ranks_per_host;
    add(StateRow::parameters, "hpZ secondary copies", n * ec, false);
  }
  // Gathers not of the compute copy itself (Note [Quantized gathers]): the records of this rank's chunks, in
  // the gatherer (stage 3: after hpZ's copies; stages 1-2: after the optimizer state, in the order below).
  const zero::GatherCodec codec(s.compute, s.gather, s.quant_block);
  int64_t records = 0;
  if (!codec.direct() && rules.sharded)
    for (size_t p = 0; p < s.layout.partitions.size(); ++p) records += codec.record_bytes(s.layout.chunk(p));
  if (rules.unit_gathers) add(StateRow::parameters, "gather records", records, false);
  // fp32 master chunks: separate from the compute copy under mixed precision or offload, and at stages 1-2
  // when the gathered values land in every chunk of the compute copy.
  if (mixed || off || (records > 0 && !rules.unit_gathers))
    add(StateRow::master_weights, fmt::format("fp32 master{}", shard_name), shard * 4, off);
  // Stages 0-1: the full gradient buffer the .grads view (compute dtype).
  if (!rules.buckets)
    add(StateRow::gradients, mixed ? "16-bit gradients" : "flat gradients", psi * ec, false);
  // fp32 gradient chunks: stages 2-3, mixed precision, offload.
  if (rules.buckets || mixed || off)
    add(StateRow::gradients, fmt::format("fp32 gradient{}", rules.sharded ? " shard" : "s"), shard * 4, off);
  static const char* const kAdamW[] = {"exp_avg", "exp_avg_sq"};
  for (int i = 0; i < s.optimizer_state_tensors; ++i)
    add(StateRow::optimizer_state, s.optimizer_state_tensors == 2 ? kAdamW[i] : "momentum_buffer", shard * 4,
        off);
  // WeightEma over the master chunks: on their device, which under offload is the host (not pinned: on the
  // CPU backend that is the training device's allocator).
  if (s.ema) add(StateRow::ema, "EMA weights", shard * 4, off && !s.cpu_device);
  if (!rules.unit_gathers) add(StateRow::parameters, "gather records", records, false);
  return z;
}

}  // namespace cz::plan
