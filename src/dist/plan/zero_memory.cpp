// Note [ZeRO memory model] (zero_memory.h): partitions and per-rank model-state buffers.
#include "dist/plan/zero_memory.h"

#include <algorithm>
#include <cmath>

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
    case StateRow::comm_buffers:
      return "comm_buffers";
    case StateRow::gather_buffers:
      return "gather_buffers";
  }
  return "?";
}

int64_t ZeroState::row_bytes(StateRow r) const {
  int64_t n = 0;
  for (const StateBuffer& b : buffers) n += b.row == r ? b.bytes : 0;
  return n;
}

int64_t ZeroState::total_bytes() const {
  int64_t n = 0;
  for (const StateBuffer& b : buffers) n += b.bytes;
  return n;
}

int64_t pad_partition(int64_t n, int world) {
  const int64_t q = 16 * int64_t(world);
  return (n + q - 1) / q * q;
}

std::vector<int64_t> zero_partitions(const std::vector<ParamInfo>& params, int stage, double bucket_mb,
                                     DType reduce, int world) {
  CZ_CHECK(stage >= 0 && stage <= 3, "zero_partitions: stage must be 0-3, got {}", stage);
  CZ_CHECK(world >= 1, "zero_partitions: world must be >= 1, got {}", world);
  CZ_CHECK(bucket_mb > 0, "zero_partitions: bucket_mb must be positive, got {}", bucket_mb);
  std::vector<int64_t> parts;
  int64_t cur = 0;
  auto close = [&] {
    if (cur > 0) parts.push_back(pad_partition(cur, world));
    cur = 0;
  };
  if (stage == 3) {
    std::string unit;
    for (const ParamInfo& p : params) {
      if (p.unit != unit) close();
      unit = p.unit;
      cur += (p.numel + 15) / 16 * 16;
    }
  } else {
    const auto limit = int64_t(std::floor(bucket_mb * double(1 << 20) / double(dtype_size(reduce))));
    for (const ParamInfo& p : params) {
      const int64_t n = (p.numel + 15) / 16 * 16;
      if (cur > 0 && cur + n > limit) close();
      cur += n;
    }
  }
  close();
  return parts;
}

ZeroState zero_model_state(const ZeroSpec& s) {
  CZ_CHECK(s.stage >= 0 && s.stage <= 3, "ZeRO memory model: stage must be 0-3, got {}", s.stage);
  CZ_CHECK(s.world >= 1, "ZeRO memory model: world must be >= 1, got {}", s.world);
  CZ_CHECK(!s.partitions.empty(), "ZeRO memory model: no partitions");
  CZ_CHECK(s.prefetch >= 0, "ZeRO memory model: prefetch must be >= 0, got {}", s.prefetch);
  CZ_CHECK(!s.offload, "ZeRO memory model: offload is not built yet");
  ZeroState z;
  for (int64_t p : s.partitions) {
    CZ_CHECK(p > 0 && p % (16 * int64_t(s.world)) == 0,
             "ZeRO memory model: partition of {} elements is not a positive multiple of 16 x {} ranks", p,
             s.world);
    z.psi += p;
    z.max_partition = std::max(z.max_partition, p);
  }
  z.shard = z.psi / s.world;
  const bool mixed = s.compute != DType::f32;
  const int64_t ec = int64_t(dtype_size(s.compute)), er = int64_t(dtype_size(s.reduce));
  const int64_t psi = z.psi, shard = z.shard;
  const int64_t replicated_or_shard = s.stage == 0 ? psi : shard;  // what stage 0 keeps whole, 1-3 shard
  auto add = [&](StateRow row, std::string name, int64_t bytes) {
    if (bytes > 0) z.buffers.push_back({row, std::move(name), bytes});
  };

  if (mixed) {
    add(StateRow::parameters, s.stage == 3 ? "16-bit parameter shard" : "16-bit compute copy",
        (s.stage == 3 ? shard : psi) * ec);
    add(StateRow::master_weights, s.stage == 0 ? "fp32 master weights" : "fp32 master shard",
        replicated_or_shard * 4);
    if (s.stage <= 1) {
      add(StateRow::gradients, "16-bit gradients", psi * ec);
      add(StateRow::gradients, s.stage == 0 ? "fp32 master gradients" : "fp32 master-gradient shard",
          replicated_or_shard * 4);
    } else {
      add(StateRow::gradients, "fp32 gradient shard", shard * 4);
    }
  } else {
    add(StateRow::parameters, s.stage == 3 ? "parameter shard" : "flat parameters",
        (s.stage == 3 ? shard : psi) * 4);
    add(StateRow::gradients, s.stage <= 1 ? "flat gradients" : "gradient shard",
        (s.stage <= 1 ? psi : shard) * 4);
  }
  static const char* const kStateNames[] = {"exp_avg", "exp_avg_sq"};
  for (int i = 0; i < s.optimizer_state_tensors; ++i)
    add(StateRow::optimizer_state,
        s.optimizer_state_tensors == 2 ? kStateNames[i] : fmt::format("optimizer state {}", i),
        replicated_or_shard * 4);
  if (s.ema) add(StateRow::ema, "EMA weights", replicated_or_shard * 4);

  if (s.stage >= 2) {
    for (int i = 0; i < 3; ++i) add(StateRow::comm_buffers, "bucket buffer", z.max_partition * er);
  } else if (s.reduce != s.compute) {
    add(StateRow::comm_buffers, "reduce cast buffer", z.max_partition * er);
  }
  if (s.stage == 3) {
    // The largest window of (1 + prefetch) consecutive units, one gathered buffer each.
    const size_t w = std::min(s.partitions.size(), size_t(s.prefetch) + 1);
    size_t best = 0;
    int64_t best_sum = -1, sum = 0;
    for (size_t i = 0; i < s.partitions.size(); ++i) {
      sum += s.partitions[i];
      if (i >= w) sum -= s.partitions[i - w];
      if (i + 1 >= w && sum > best_sum) {
        best_sum = sum;
        best = i + 1 - w;
      }
    }
    for (size_t i = best; i < best + w; ++i)
      add(StateRow::gather_buffers, "gathered unit", s.partitions[i] * ec);
  }
  return z;
}

}  // namespace cz::plan
