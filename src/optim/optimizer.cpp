// Shared construction, argument checks and state loading of the shard optimizers.
#include "optim/optimizer.h"

#include <cmath>

namespace cz {

Optimizer::Optimizer(const char* name, const FlatLayout& layout, ShardRange shard,
                     const std::vector<ParamHyper>& hyper, DType dtype, Device device)
    : name_(name), shard_(shard), dtype_(dtype), device_(device) {
  check_shard_range(name, layout, shard);
  CZ_CHECK(hyper.size() == layout.segments.size(),
           "{}: {} hyper-parameter entries for a layout of {} parameters", name, hyper.size(),
           layout.segments.size());
  CZ_CHECK_DTYPE(dtype == DType::f32 || dtype == DType::f64, "{}: master weights must be f32 or f64, got {}",
                 name, dtype_name(dtype));
  pieces_ = shard_pieces(layout, shard, hyper);
}

void Optimizer::check_step(const Tensor& params, const Tensor& grads, double lr) const {
  CZ_CHECK(std::isfinite(lr) && lr >= 0, "{}.step: lr must be a finite value >= 0, got {}", name_, lr);
  const auto check_one = [&](const char* what, const Tensor& t) {
    CZ_CHECK(t.defined(), "{}.step: {} is an undefined tensor", name_, what);
    CZ_CHECK_SHAPE(t.dim() == 1 && t.numel() == shard_.numel(),
                   "{}.step: {} has shape {} but the shard [{}, {}) has {} elements", name_, what,
                   shape_str(t.sizes()), shard_.begin, shard_.end, shard_.numel());
    CZ_CHECK_SHAPE(t.is_contiguous(), "{}.step: {} must be contiguous", name_, what);
    CZ_CHECK_DTYPE(t.dtype() == dtype_, "{}.step: {} is {} but the optimizer state is {}", name_, what,
                   dtype_name(t.dtype()), dtype_name(dtype_));
    CZ_CHECK_DEVICE(t.device() == device_, "{}.step: {} is on {} but the optimizer state is on {}", name_,
                    what, t.device().str(), device_.str());
  };
  check_one("params", params);
  check_one("grads", grads);
}

Tensor Optimizer::new_state() const {
  return zeros({shard_.numel()}, dtype_, device_);
}

Tensor Optimizer::step_tensor() const {
  return from_vector(std::vector<int64_t>{step_}, {});
}

void Optimizer::load_named(const NamedTensors& state, const std::vector<std::string>& names,
                           const std::vector<Tensor*>& dst) {
  std::vector<bool> seen(names.size() + 1, false);
  const Tensor* step = nullptr;
  for (const auto& [key, t] : state) {
    size_t k = 0;
    while (k < names.size() && names[k] != key) ++k;
    CZ_CHECK_IO(k < names.size() || key == "step",
                "{}.load_state: unexpected state '{}' (expected {} and step)", name_, key,
                fmt::join(names, ", "));
    CZ_CHECK_IO(!seen[k], "{}.load_state: state '{}' given twice", name_, key);
    seen[k] = true;
    CZ_CHECK_IO(t.defined(), "{}.load_state: '{}' is an undefined tensor", name_, key);
    if (k == names.size()) {
      CZ_CHECK_IO(t.numel() == 1, "{}.load_state: 'step' must have one element, got shape {}", name_,
                  shape_str(t.sizes()));
      step = &t;
      continue;
    }
    CZ_CHECK_IO(t.dim() == 1 && t.numel() == shard_.numel(),
                "{}.load_state: '{}' has shape {} but the shard [{}, {}) has {} elements", name_, key,
                shape_str(t.sizes()), shard_.begin, shard_.end, shard_.numel());
    CZ_CHECK_IO(is_floating(t.dtype()), "{}.load_state: '{}' must be floating point, got {}", name_, key,
                dtype_name(t.dtype()));
  }
  for (size_t k = 0; k <= names.size(); ++k)
    CZ_CHECK_IO(seen[k], "{}.load_state: missing state '{}'", name_, k < names.size() ? names[k] : "step");
  const double s = step->item();
  CZ_CHECK_IO(s >= 0 && s == std::floor(s), "{}.load_state: 'step' must be a whole number >= 0, got {}",
              name_, s);
  // Validate everything before writing anything, so a failed load leaves the optimizer as it was.
  for (const auto& [key, t] : state) {
    for (size_t k = 0; k < names.size(); ++k)
      if (names[k] == key) dst[k]->copy_(t);
  }
  step_ = int64_t(s);
}

}  // namespace cz
