// The backward engine and grad mode.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace cz {

// Grad mode is per thread and on by default. With it off, ops record nothing.
class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool on);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// Runs backward from `roots`, seeded with `grads` (ones for scalar roots when undefined). Gradients
// accumulate into leaves' `.grad` and fire their grad-ready hooks. The graph's saved tensors are freed as
// nodes run.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads);

// Like torch.autograd.grad: returns d(roots)/d(inputs) without touching any `.grad` and without firing hooks.
// `inputs` must be leaves that require grad. Inputs the roots do not depend on get an undefined tensor.
std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                         const std::vector<Tensor>& inputs);

}  // namespace cz
