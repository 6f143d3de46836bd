// LayerNorm: validation, dispatch and backward rule (mean and rstd come from the forward pass).
#include "tensor/ops/layer_norm.h"

#include <cmath>

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

class LayerNormBackward final : public Node {
 public:
  LayerNormBackward(const Tensor& x2d, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                    Shape x_sizes)
      : x_(x2d), weight_(weight), mean_(mean), rstd_(rstd), x_sizes_(std::move(x_sizes)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor x = x_.get(), mean = mean_.get(), rstd = rstd_.get();
    const Tensor weight = weight_.get();  // undefined without an affine weight
    const Tensor gy = g[0].contiguous().view(x.sizes());
    const int64_t C = x.size(1);
    Tensor dx = needs_input_grad(0) ? empty_like(x) : Tensor();
    Tensor dw = needs_input_grad(1) ? empty({C}, x.dtype(), x.device()) : Tensor();
    Tensor db = needs_input_grad(2) ? empty({C}, x.dtype(), x.device()) : Tensor();
    if (x.is_cpu())
      cpu::layer_norm_backward(gy, x, weight, mean, rstd, dx, dw, db);
    else
      CZ_CUDA_CALL(cuda::layer_norm_backward(gy, x, weight, mean, rstd, dx, dw, db, ops::stream_of(x)));
    return {dx.defined() ? dx.view(x_sizes_) : dx, dw, db};
  }
  std::string name() const override { return "LayerNormBackward"; }
  void release_saved() override {
    x_.reset();
    weight_.reset();
    mean_.reset();
    rstd_.reset();
  }

 private:
  SavedTensor x_, weight_, mean_, rstd_;
  Shape x_sizes_;
};

void check_param(const char* what, const Tensor& p, const Tensor& x) {
  if (!p.defined()) return;
  ops::check_like("layer_norm", what, p, "x", x);
  CZ_CHECK_SHAPE(p.dim() == 1 && p.size(0) == x.size(-1),
                 "layer_norm: {} has shape {} but x has C={} (shape {})", what, shape_str(p.sizes()),
                 x.size(-1), shape_str(x.sizes()));
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  ops::check_floating("layer_norm", "x", x);
  profiler::Scope prof("layer_norm", x.device());
  ops::check_cpu_compute_dtype("layer_norm", x);
  CZ_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) > 0,
                 "layer_norm: x must have a non-empty last dimension, got shape {}", shape_str(x.sizes()));
  check_param("weight", weight, x);
  check_param("bias", bias, x);
  CZ_CHECK(std::isfinite(eps) && eps >= 0, "layer_norm: eps must be finite and non-negative, got {}", eps);
  const int64_t C = x.size(-1);
  const Tensor x2d = x.contiguous().detach().view({-1, C});
  const int64_t rows = x2d.size(0);
  const Tensor wc = weight.defined() ? weight.contiguous() : Tensor();
  const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  Tensor out = empty(x.sizes(), x.dtype(), x.device());
  Tensor out2d = out.view({rows, C});
  // Statistics in the accumulation type (f32 for 16-bit data on CUDA; the CPU computes in f32/f64 anyway), so
  // backward does not renormalise with rounded values.
  const DType stat_t = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor mean = empty({rows}, stat_t, x.device()), rstd = empty({rows}, stat_t, x.device());
  if (x.is_cpu())
    cpu::layer_norm_forward(x2d, wc, bc, eps, out2d, mean, rstd);
  else
    CZ_CUDA_CALL(cuda::layer_norm_forward(x2d, wc, bc, eps, out2d, mean, rstd, ops::stream_of(x)));
  if (should_record({&x, &weight, &bias}))
    record(std::make_shared<LayerNormBackward>(x2d, wc, mean, rstd, x.sizes()), {&x, &weight, &bias}, {&out});
  return out;
}

}  // namespace cz
