// Gradient norms, clipping coefficients and non-finite checks, dispatched to the CPU or CUDA kernels.
#include "optim/clip.h"

#include <cmath>

#include "optim/cpu_kernels.h"
#include "optim/cuda_kernels.h"
#include "tensor/dispatch.h"
#include "tensor/stream.h"

namespace cz {
namespace {

void check_float(const char* op, const Tensor& t) {
  CZ_CHECK(t.defined(), "{}: undefined tensor", op);
  CZ_CHECK_DTYPE(t.dtype() == DType::f32 || t.dtype() == DType::f64, "{}: needs an f32 or f64 tensor, got {}",
                 op, dtype_name(t.dtype()));
}

}  // namespace

Tensor grad_sq_norm(const Tensor& grads) {
  check_float("grad_sq_norm", grads);
  const Tensor x = grads.contiguous();
  Tensor out = empty({}, DType::f64, grads.device());
  if (x.is_cpu())
    cpu::sq_norm(x, out);
  else
    CZ_CUDA_CALL(cuda::sq_norm(x, out, current_stream(x.device())));
  return out;
}

double clip_coefficient(double total_norm, double max_norm) {
  CZ_CHECK(std::isfinite(max_norm) && max_norm > 0,
           "clip_coefficient: max_norm must be a finite value > 0, got {}", max_norm);
  const double coef = max_norm / (total_norm + 1e-6);
  return std::isnan(coef) || coef < 1.0 ? coef : 1.0;  // std::min would turn NaN into 1
}

void scale_(const Tensor& grads, double coef) {
  check_float("scale_", grads);
  if (coef == 1.0) return;
  Tensor(grads).mul_(coef);
}

bool has_non_finite(const Tensor& t) {
  check_float("has_non_finite", t);
  Tensor x = t.contiguous();
  Tensor found = zeros({}, DType::f32, t.device());
  if (x.is_cpu())
    cpu::unscale_and_check(x, 1.0, found);
  else
    CZ_CUDA_CALL(cuda::unscale_and_check(x, 1.0, found, current_stream(x.device())));
  return found.item() != 0.0;
}

double clip_grad_norm_(const Tensor& grads, double max_norm) {
  const double norm = std::sqrt(grad_sq_norm(grads).item());
  scale_(grads, clip_coefficient(norm, max_norm));
  return norm;
}

}  // namespace cz
