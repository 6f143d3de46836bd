// Note [ZeRO memory model] (zero_memory.h): the engine's partitions and the per-rank model-state buffers.
#include "dist/plan/zero_memory.h"

#include <algorithm>

#include <fmt/format.h>

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

zero::ZeroLayout zero_layout(const std::vector<nn::ParamInfo>& params, const zero::StepPlan& plan) {
  std::vector<zero::ParamShape> shapes;
  std::vector<std::string> unit_of;
  int64_t numel = 0;
  for (const nn::ParamInfo& p : params) {
    shapes.push_back({p.name, p.shape});
    numel += shape_numel(p.shape);
    if (plan.unit_gathers()) unit_of.push_back(p.unit);
  }
  return zero::plan_layout(shapes, plan, plan.bucket_elems(numel), unit_of);
}

// Note [What each rank keeps], buffer by buffer in the order the ZeroEngine constructor allocates them.
ZeroState zero_model_state(const ZeroSpec& s) {
  CZ_CHECK(!s.layout.partitions.empty(), "ZeRO memory model: no partitions");
  const zero::StepPlan& plan = s.plan;
  CZ_CHECK(s.layout.shards == plan.layout_shards(),
           "ZeRO memory model: a layout of {} shards for stage {} on {} ranks", s.layout.shards, plan.stage(),
           plan.shards());
  ZeroState z;
  z.psi = s.layout.flat.numel;
  z.shard = s.layout.shard_numel();
  for (const zero::Partition& p : s.layout.partitions) z.max_partition = std::max(z.max_partition, p.numel);
  const bool mixed = plan.mixed(), off = plan.offload();
  const int64_t ec = int64_t(dtype_size(plan.compute()));
  const int64_t psi = z.psi, shard = z.shard;
  auto add = [&](StateRow row, std::string name, int64_t bytes, bool host) {
    if (bytes > 0) z.buffers.push_back({row, std::move(name), bytes, host});
  };
  const char* shard_name = plan.sharded() ? " shard" : "";

  // The compute copy: full, or this rank's chunks and hpZ's secondary copies, the host-local slice of every
  // unit (UnitGatherer, after the shard).
  if (plan.full_params())
    add(StateRow::parameters, mixed ? "16-bit compute copy" : "flat parameters", psi * ec, false);
  else
    add(StateRow::parameters, mixed ? "16-bit parameter shard" : "parameter shard", shard * ec, false);
  if (plan.hpz()) {
    int64_t n = 0;
    for (const zero::Partition& p : s.layout.partitions) n += p.numel / plan.hpz_ranks();
    add(StateRow::parameters, "hpZ secondary copies", n * ec, false);
  }
  // The records of this rank's chunks (Note [Quantized gathers]), in the gatherer: with the units' gatherer
  // after hpZ's copies, with the chunks' after the optimizer state (below).
  int64_t records = 0;
  if (plan.gather_records())
    for (size_t p = 0; p < s.layout.partitions.size(); ++p)
      records += plan.codec().record_bytes(s.layout.chunk(p));
  if (!plan.full_params()) add(StateRow::parameters, "gather records", records, false);
  if (plan.own_master())
    add(StateRow::master_weights, fmt::format("fp32 master{}", shard_name), shard * 4, off);
  if (plan.full_grads())
    add(StateRow::gradients, mixed ? "16-bit gradients" : "flat gradients", psi * ec, false);
  if (plan.grad_chunks())
    add(StateRow::gradients, fmt::format("fp32 gradient{}", plan.sharded() ? " shard" : "s"), shard * 4, off);
  static const char* const kAdamW[] = {"exp_avg", "exp_avg_sq"};
  for (int i = 0; i < s.optimizer_state_tensors; ++i)
    add(StateRow::optimizer_state, s.optimizer_state_tensors == 2 ? kAdamW[i] : "momentum_buffer", shard * 4,
        off);
  // WeightEma over the master chunks: on their device, which under offload is the host (not pinned: on the
  // CPU backend that is the training device's allocator).
  if (s.ema) add(StateRow::ema, "EMA weights", shard * 4, off && !s.cpu_device);
  if (plan.full_params()) add(StateRow::parameters, "gather records", records, false);
  return z;
}

}  // namespace cz::plan
