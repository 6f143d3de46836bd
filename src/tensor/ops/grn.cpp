// GRN: validation, dispatch and backward rule (the norms gx and the divisors d come from the forward pass).
#include "tensor/ops/grn.h"

#include <cmath>

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

class GrnBackward final : public Node {
 public:
  GrnBackward(const Tensor& x, const Tensor& gamma, const Tensor& gx, const Tensor& d)
      : x_(x), gamma_(gamma), gx_(gx), d_(d) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor x = x_.get(), gamma = gamma_.get(), gx = gx_.get(), d = d_.get();
    const Tensor gy = g[0].contiguous();
    const int64_t C = x.size(3);
    Tensor dx = needs_input_grad(0) ? empty_like(x) : Tensor();
    Tensor dgamma = needs_input_grad(1) ? empty({C}, x.dtype(), x.device()) : Tensor();
    Tensor dbeta = needs_input_grad(2) ? empty({C}, x.dtype(), x.device()) : Tensor();
    if (x.is_cpu())
      cpu::grn_backward(gy, x, gamma, gx, d, dx, dgamma, dbeta);
    else
      CZ_CUDA_CALL(cuda::grn_backward(gy, x, gamma, gx, d, dx, dgamma, dbeta, ops::stream_of(x)));
    return {dx, dgamma, dbeta};
  }
  std::string name() const override { return "GrnBackward"; }
  void release_saved() override {
    x_.reset();
    gamma_.reset();
    gx_.reset();
    d_.reset();
  }

 private:
  SavedTensor x_, gamma_, gx_, d_;
};

void check_param(const char* what, const Tensor& p, const Tensor& x) {
  ops::check_like("grn", what, p, "x", x);
  CZ_CHECK_SHAPE(p.dim() == 1 && p.size(0) == x.size(3), "grn: {} has shape {} but x has C={} (shape {})",
                 what, shape_str(p.sizes()), x.size(3), shape_str(x.sizes()));
}

}  // namespace

Tensor grn(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  ops::check_floating("grn", "x", x);
  profiler::Scope prof("grn", x.device());
  ops::check_cpu_compute_dtype("grn", x);
  ops::check_dim("grn", "x", x, 4, "NHWC (N, H, W, C)");
  CZ_CHECK_SHAPE(x.size(1) * x.size(2) > 0 && x.size(3) > 0,
                 "grn: x needs pixels and channels to normalize over, got shape {}", shape_str(x.sizes()));
  check_param("gamma", gamma, x);
  check_param("beta", beta, x);
  CZ_CHECK(std::isfinite(eps) && eps >= 0, "grn: eps must be finite and non-negative, got {}", eps);
  const Tensor xc = x.contiguous().detach();
  const Tensor gc = gamma.contiguous(), bc = beta.contiguous();
  Tensor out = empty(x.sizes(), x.dtype(), x.device());
  // The norms and divisors in the accumulation type (f32 for 16-bit data on CUDA), as LayerNorm's statistics.
  const DType stat_t = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor gx = empty({x.size(0), x.size(3)}, stat_t, x.device()), d = empty({x.size(0)}, stat_t, x.device());
  if (x.is_cpu())
    cpu::grn_forward(xc, gc, bc, eps, out, gx, d);
  else
    CZ_CUDA_CALL(cuda::grn_forward(xc, gc, bc, eps, out, gx, d, ops::stream_of(x)));
  if (should_record({&x, &gamma, &beta}))
    record(std::make_shared<GrnBackward>(xc, gc, gx, d), {&x, &gamma, &beta}, {&out});
  return out;
}

}  // namespace cz
