// linear_gelu and linear_scale_residual: validation, dispatch and backward rules. On the CPU one tiled kernel
// each way (cpu/linear_fused.cpp); on CUDA the existing kernels in sequence, with the same tensors allocated
// in the same order and saved, so that the memory plan is one model for both backends.
#include "tensor/ops/linear_fused.h"

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  ops::check_floating(op, "x", x);
  ops::check_cpu_compute_dtype(op, x);
  ops::check_like(op, "weight", weight, "x", x);
  CZ_CHECK_SHAPE(weight.dim() == 2, "{}: weight must be (out, in), got {}", op, shape_str(weight.sizes()));
  CZ_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) == weight.size(1),
                 "{}: input has {} features (shape {}) but weight {} expects {}", op,
                 x.dim() ? x.size(-1) : 0, shape_str(x.sizes()), shape_str(weight.sizes()), weight.size(1));
  if (bias.defined()) {
    ops::check_like(op, "bias", bias, "x", x);
    CZ_CHECK_SHAPE(bias.dim() == 1 && bias.size(0) == weight.size(0), "{}: bias has shape {}, expected ({})",
                   op, shape_str(bias.sizes()), weight.size(0));
  }
}

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

class LinearGeluBackward final : public Node {
 public:
  LinearGeluBackward(const Tensor& x2d, const Tensor& h, const Tensor& w, Shape x_sizes)
      : x_(x2d), h_(h), w_(w), x_sizes_(std::move(x_sizes)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor x = x_.get(), h = h_.get(), w = w_.get();
    const Tensor gy = g[0].contiguous().view({x.size(0), w.size(0)});
    Tensor gh = empty_like(h);
    Tensor dx = needs_input_grad(0) ? empty_like(x) : Tensor();
    Tensor dw = needs_input_grad(1) ? empty_like(w) : Tensor();
    Tensor db = needs_input_grad(2) ? empty({w.size(0)}, w.dtype(), w.device()) : Tensor();
    if (gy.is_cpu()) {
      cpu::linear_gelu_backward(gy, x, h, w, gh, dx, dw, db);
    } else {
      CZ_CUDA_CALL(cuda::gelu_backward(gy, h, gh, ops::stream_of(gy)));
      CZ_CUDA_CALL(cuda::linear_backward(gh, x, w, dx, dw, db, ops::stream_of(gy)));
    }
    return {dx.defined() ? dx.view(x_sizes_) : dx, dw, db};
  }
  std::string name() const override { return "LinearGeluBackward"; }
  void release_saved() override {
    x_.reset();
    h_.reset();
    w_.reset();
  }

 private:
  SavedTensor x_, h_, w_;
  Shape x_sizes_;
};

class LinearScaleResidualBackward final : public Node {
 public:
  LinearScaleResidualBackward(const Tensor& x2d, const Tensor& y, const Tensor& w, const Tensor& gamma,
                              Shape x_sizes)
      : x_(x2d), y_(y), w_(w), gamma_(gamma), x_sizes_(std::move(x_sizes)) {}
  // Inputs: residual, x, weight, bias, gamma.
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor x = x_.get(), y = y_.get(), w = w_.get(), gamma = gamma_.get();
    const Tensor g = grads[0].contiguous().view({x.size(0), w.size(0)});
    const bool branch = needs_input_grad(1) || needs_input_grad(2) || needs_input_grad(3);
    Tensor gb = branch ? empty_like(y) : Tensor();
    Tensor dgamma = needs_input_grad(4) ? empty_like(gamma) : Tensor();
    Tensor dx = needs_input_grad(1) ? empty_like(x) : Tensor();
    Tensor dw = needs_input_grad(2) ? empty_like(w) : Tensor();
    Tensor db = needs_input_grad(3) ? empty({w.size(0)}, w.dtype(), w.device()) : Tensor();
    if (g.is_cpu()) {
      if (branch)
        cpu::linear_scale_residual_backward(g, x, y, w, gamma, gb, dx, dw, db, dgamma);
      else
        cpu::channel_scale_backward(g, y, gamma, gb, dgamma);
    } else {
      CZ_CUDA_CALL(cuda::channel_scale_backward(g, y, gamma, gb, dgamma, ops::stream_of(g)));
      if (branch) CZ_CUDA_CALL(cuda::linear_backward(gb, x, w, dx, dw, db, ops::stream_of(g)));
    }
    return {needs_input_grad(0) ? grads[0] : Tensor(), dx.defined() ? dx.view(x_sizes_) : dx, dw, db, dgamma};
  }
  std::string name() const override { return "LinearScaleResidualBackward"; }
  void release_saved() override {
    x_.reset();
    y_.reset();
    w_.reset();
    gamma_.reset();
  }

 private:
  SavedTensor x_, y_, w_, gamma_;
  Shape x_sizes_;
};

}  // namespace

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear("linear_gelu", x, weight, bias);
  profiler::Scope prof("linear_gelu", x.device());
  const int64_t in = weight.size(1), out_features = weight.size(0);
  const Tensor x2d = x.contiguous().detach().view({-1, in});
  const Tensor wc = weight.contiguous();
  const Shape out_sizes = with_last(x.sizes(), out_features);
  Tensor h = empty({x2d.size(0), out_features}, x.dtype(), x.device());
  Tensor out = empty(out_sizes, x.dtype(), x.device());
  Tensor out2d = out.view({x2d.size(0), out_features});
  if (x.is_cpu()) {
    cpu::linear_gelu_forward(x2d, wc, bias, h, out2d);
  } else {
    CZ_CUDA_CALL(cuda::linear_forward(x2d, wc, bias, h, ops::stream_of(x)));
    CZ_CUDA_CALL(cuda::gelu_forward(h, out2d, ops::stream_of(x)));
  }
  if (should_record({&x, &weight, &bias}))
    record(std::make_shared<LinearGeluBackward>(x2d, h, wc, x.sizes()), {&x, &weight, &bias}, {&out});
  return out;
}

Tensor linear_scale_residual(const Tensor& residual, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, const Tensor& gamma) {
  const char* op = "linear_scale_residual";
  check_linear(op, x, weight, bias);
  profiler::Scope prof(op, x.device());
  const int64_t in = weight.size(1), out_features = weight.size(0);
  const Shape out_sizes = with_last(x.sizes(), out_features);
  ops::check_like(op, "gamma", gamma, "x", x);
  CZ_CHECK_SHAPE(gamma.dim() == 1 && gamma.size(0) == out_features,
                 "{}: gamma has shape {} but the layer has {} outputs (gamma must be ({}))", op,
                 shape_str(gamma.sizes()), out_features, out_features);
  ops::check_like(op, "residual", residual, "x", x);
  CZ_CHECK_SHAPE(residual.sizes() == out_sizes, "{}: residual has shape {} but the layer's output is {}", op,
                 shape_str(residual.sizes()), shape_str(out_sizes));
  const Tensor x2d = x.contiguous().detach().view({-1, in});
  const Tensor wc = weight.contiguous(), rc = residual.contiguous();
  const int64_t rows = x2d.size(0);
  Tensor y = empty({rows, out_features}, x.dtype(), x.device());
  Tensor out = empty(out_sizes, x.dtype(), x.device());
  Tensor out2d = out.view({rows, out_features});
  if (x.is_cpu()) {
    cpu::linear_scale_residual_forward(x2d, wc, bias, gamma, rc.view({rows, out_features}), y, out2d);
  } else {
    CZ_CUDA_CALL(cuda::linear_forward(x2d, wc, bias, y, ops::stream_of(x)));
    CZ_CUDA_CALL(cuda::residual_scale_add(rc.view({rows, out_features}), y, gamma, out2d, ops::stream_of(x)));
  }
  if (should_record({&residual, &x, &weight, &bias, &gamma}))
    record(std::make_shared<LinearScaleResidualBackward>(x2d, y, wc, gamma, x.sizes()),
           {&residual, &x, &weight, &bias, &gamma}, {&out});
  return out;
}

}  // namespace cz
