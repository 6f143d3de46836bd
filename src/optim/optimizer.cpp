// Shared construction, argument checks and state loading of the shard optimizers.
#include "optim/optimizer.h"

#include <cmath>

#include "optim/device_scalars.h"

namespace cz {

Optimizer::Optimizer(const char* name, const FlatLayout& layout, std::vector<ShardRange> ranges,
                     const std::vector<ParamHyper>& hyper, DType dtype, Device device, bool pinned_state)
    : name_(name), ranges_(std::move(ranges)), dtype_(dtype), device_(device), pinned_state_(pinned_state) {
  CZ_CHECK_DEVICE(!pinned_state || device.is_cpu(), "{}: pinned state is host memory, but the device is {}",
                  name, device.str());
  CZ_CHECK(!ranges_.empty(), "{}: a shard needs at least one range", name);
  CZ_CHECK(hyper.size() == layout.segments.size(),
           "{}: {} hyper-parameter entries for a layout of {} parameters", name, hyper.size(),
           layout.segments.size());
  CZ_CHECK_DTYPE(dtype == DType::f32 || dtype == DType::f64, "{}: master weights must be f32 or f64, got {}",
                 name, dtype_name(dtype));
  for (size_t i = 0; i < ranges_.size(); ++i) {
    check_shard_range(name, layout, ranges_[i]);
    CZ_CHECK(i == 0 || ranges_[i - 1].end <= ranges_[i].begin,
             "{}: shard ranges must be sorted and disjoint, got [{}, {}) before [{}, {})", name,
             ranges_[i - 1].begin, ranges_[i - 1].end, ranges_[i].begin, ranges_[i].end);
    offsets_.push_back(numel_);
    numel_ += ranges_[i].numel();
    pieces_.push_back(shard_pieces(layout, ranges_[i], hyper));
  }
}

ShardRange Optimizer::shard() const {
  CZ_ASSERT(ranges_.size() == 1, "{}: shard() of a shard of {} ranges", name_, ranges_.size());
  return ranges_.front();
}

const std::vector<ShardPiece>& Optimizer::pieces() const {
  CZ_ASSERT(ranges_.size() == 1, "{}: pieces() of a shard of {} ranges", name_, ranges_.size());
  return pieces_.front();
}

void Optimizer::step(std::span<const Tensor> params, std::span<const Tensor> grads, double lr) {
  check_step(params, grads, lr);
  for (size_t i = 0; i < ranges_.size(); ++i) {
    Tensor p = params[i];
    update_range(p, grads[i], offsets_[i], ranges_[i].numel(), pieces_[i], lr);
  }
  ++step_;
  for (const Tensor& p : params) bump(p);
  finish_step(params);
}

void Optimizer::step_range(size_t i, const Tensor& params, const Tensor& grads, double lr) {
  CZ_CHECK(i < ranges_.size(), "{}.step_range: range {} of {}", name_, i, ranges_.size());
  CZ_CHECK(std::isfinite(lr) && lr >= 0, "{}.step: lr must be a finite value >= 0, got {}", name_, lr);
  check_range(i, params, grads);
  Tensor p = params;
  update_range(p, grads, offsets_[i], ranges_[i].numel(), pieces_[i], lr);
  bump(params);
}

void Optimizer::write_scalars(double lr, double* slots) const {
  CZ_CHECK(std::isfinite(lr) && lr >= 0, "{}.step: lr must be a finite value >= 0, got {}", name_, lr);
  slots[optim_scalars::kLr] = lr;
  write_own_scalars(slots);
}

void Optimizer::step_on_device(std::span<const Tensor> params, std::span<const Tensor> grads,
                               const Tensor& scalars, const Tensor& found) {
  CZ_CHECK_DEVICE(device_.is_cuda(), "{}: the update from device scalars needs a CUDA optimizer, not {}",
                  name_, device_.str());
  check_step(params, grads, 0.0);
  for (size_t i = 0; i < ranges_.size(); ++i) {
    Tensor p = params[i];
    update_range_dev(p, grads[i], offsets_[i], ranges_[i].numel(), pieces_[i], scalars, found);
  }
}

void Optimizer::count_step(bool taken) {
  if (!taken) return;
  ++step_;
  finish_step({});
}

void Optimizer::set_step_count(int64_t steps) {
  CZ_CHECK(steps >= 0, "{}: step count must be >= 0, got {}", name_, steps);
  step_ = steps;
}

void Optimizer::end_step() {
  ++step_;
  finish_step({});
}

void Optimizer::check_step(std::span<const Tensor> params, std::span<const Tensor> grads, double lr) const {
  CZ_CHECK(std::isfinite(lr) && lr >= 0, "{}.step: lr must be a finite value >= 0, got {}", name_, lr);
  CZ_CHECK(params.size() == ranges_.size() && grads.size() == ranges_.size(),
           "{}.step: {} params and {} grads tensors for a shard of {} range(s)", name_, params.size(),
           grads.size(), ranges_.size());
  for (size_t i = 0; i < ranges_.size(); ++i) check_range(i, params[i], grads[i]);
}

void Optimizer::check_range(size_t i, const Tensor& params, const Tensor& grads) const {
  const ShardRange& r = ranges_[i];
  const auto check_one = [&](const char* what, const Tensor& t) {
    CZ_CHECK(t.defined(), "{}.step: {} is an undefined tensor", name_, what);
    CZ_CHECK_SHAPE(t.dim() == 1 && t.numel() == r.numel(),
                   "{}.step: {} has shape {} but the shard [{}, {}) has {} elements", name_, what,
                   shape_str(t.sizes()), r.begin, r.end, r.numel());
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
  if (pinned_state_) return empty_pinned({numel_}, dtype_).zero_();
  return zeros({numel_}, dtype_, device_);
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
    CZ_CHECK_IO(t.dim() == 1 && t.numel() == numel_,
                "{}.load_state: '{}' has shape {} but the shard {} has {} elements", name_, key,
                shape_str(t.sizes()),
                ranges_.size() == 1 ? fmt::format("[{}, {})", ranges_[0].begin, ranges_[0].end)
                                    : fmt::format("of {} ranges", ranges_.size()),
                numel_);
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
