// Partition arithmetic (Note [ZeRO partitioning]).
#include "dist/zero/partition.h"

#include <algorithm>

#include "dist/zero/step_plan.h"
#include "tensor/check.h"

namespace cz::zero {

ShardRange ZeroLayout::chunk_range(size_t p, int rank) const {
  const int64_t c = chunk(p);
  return {partitions[p].begin + rank * c, partitions[p].begin + (rank + 1) * c};
}

std::vector<ShardRange> ZeroLayout::ranges(int rank) const {
  std::vector<ShardRange> out;
  for (size_t p = 0; p < partitions.size(); ++p) out.push_back(chunk_range(p, rank));
  return out;
}

int64_t ZeroLayout::params_numel() const {
  int64_t n = 0;
  for (const FlatSegment& s : flat.segments) n += s.numel;
  return n;
}

void ZeroLayout::finish() {
  local_offsets_.clear();
  shard_numel_ = 0;
  for (size_t p = 0; p < partitions.size(); ++p) {
    local_offsets_.push_back(shard_numel_);
    shard_numel_ += chunk(p);
  }
}

int64_t bucket_elems(double bucket_bytes, size_t reduce_dtype_size, int64_t params) {
  CZ_CHECK(bucket_bytes > 0 && reduce_dtype_size > 0, "ZeRO: the bucket size must be positive, got {} bytes",
           bucket_bytes);
  const int64_t asked = std::max<int64_t>(1, int64_t(bucket_bytes / double(reduce_dtype_size)));
  return std::min(asked, std::max<int64_t>(int64_t(1) << 16, params / 4));
}

std::vector<std::string> assign_units(const std::vector<ParamShape>& params,
                                      const std::vector<std::string>& units) {
  std::vector<std::string> out;
  for (const ParamShape& p : params) {
    const std::string* best = nullptr;
    for (const std::string& u : units)
      if ((u.empty() ||
           (p.name.size() > u.size() && p.name.compare(0, u.size(), u) == 0 && p.name[u.size()] == '.')) &&
          (!best || u.size() > best->size()))
        best = &u;
    CZ_CHECK(best != nullptr, "ZeRO-3: parameter '{}' belongs to none of the {} units", p.name, units.size());
    out.push_back(*best);
  }
  return out;
}

ZeroLayout plan_layout(const std::vector<ParamShape>& params, const StepPlan& plan, int64_t bucket_elems,
                       const std::vector<std::string>& unit_of) {
  const LayoutRule rule = plan.layout_rule();
  const int64_t align = rule.align;
  const bool units = plan.unit_gathers();
  CZ_CHECK(align >= 1 && bucket_elems >= 1, "ZeRO: align ({}) and bucket size ({}) must be >= 1", align,
           bucket_elems);
  CZ_CHECK(!params.empty(), "ZeRO: no parameters");
  CZ_CHECK(!units || unit_of.size() == params.size(), "ZeRO-3: {} unit names for {} parameters",
           unit_of.size(), params.size());
  ZeroLayout z;
  z.shards = plan.layout_shards();
  z.flat.align = align;
  // A partition splits into a chunk per shard, or at stage 0 into the INT8 all-reduce's pad_ranks records.
  const int64_t pad_to = int64_t(z.shards) * rule.pad_ranks * align;
  const auto padded = [align](int64_t n) { return (n + align - 1) / align * align; };
  int64_t offset = 0;
  Partition cur;
  auto close = [&](size_t end_param) {
    cur.end_param = end_param;
    cur.numel = (offset - cur.begin + pad_to - 1) / pad_to * pad_to;
    offset = cur.begin + cur.numel;
    z.partitions.push_back(cur);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = shape_numel(params[i].shape);
    bool start_new = i == 0;
    if (i > 0) {
      if (units) {
        start_new = unit_of[i] != unit_of[i - 1];
        if (start_new)
          for (const Partition& q : z.partitions)
            CZ_CHECK(q.name != unit_of[i], "ZeRO-3: the parameters of unit '{}' are not consecutive ('{}')",
                     unit_of[i], params[i].name);
      } else {
        start_new = offset - cur.begin + n > bucket_elems;
      }
    }
    if (start_new) {
      if (i > 0) close(i);
      cur = Partition{};
      cur.begin = offset;
      cur.first_param = i;
      cur.name = units ? unit_of[i] : fmt::format("bucket {}", z.partitions.size());
    }
    z.flat.segments.push_back({params[i].name, offset, n, params[i].shape});
    offset += padded(n);
  }
  close(params.size());
  z.flat.numel = offset;
  z.finish();
  return z;
}

std::vector<std::vector<size_t>> unit_partitions(const ZeroLayout& layout,
                                                 const std::vector<std::string>& units) {
  std::vector<std::vector<size_t>> out(units.size());
  std::vector<bool> covered(layout.partitions.size(), false);
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string& name = units[u];
    for (size_t p = 0; p < layout.partitions.size(); ++p)
      for (size_t i = layout.partitions[p].first_param; i < layout.partitions[p].end_param; ++i) {
        const std::string& param = layout.flat.segments[i].name;
        if (param.size() > name.size() && param.compare(0, name.size(), name) == 0 &&
            param[name.size()] == '.') {
          out[u].push_back(p);
          covered[p] = true;
          break;
        }
      }
  }
  for (size_t p = 0; p < covered.size(); ++p)
    CZ_CHECK(covered[p], "ZeRO: partition {} ('{}') holds no parameter of any unit", p,
             layout.partitions[p].name);
  return out;
}

}  // namespace cz::zero
