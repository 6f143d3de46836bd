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

// gamma (the layer scale) and the residual of a branch whose output has `out_sizes`.
void check_scale_residual(const char* op, const Tensor& gamma, const Tensor& residual, const Tensor& x,
                          const Shape& out_sizes) {
  const int64_t out_features = out_sizes.back();
  ops::check_like(op, "gamma", gamma, "x", x);
  CZ_CHECK_SHAPE(gamma.dim() == 1 && gamma.size(0) == out_features,
                 "{}: gamma has shape {} but the layer has {} outputs (gamma must be ({}))", op,
                 shape_str(gamma.sizes()), out_features, out_features);
  ops::check_like(op, "residual", residual, "x", x);
  CZ_CHECK_SHAPE(residual.sizes() == out_sizes, "{}: residual has shape {} but the layer's output is {}", op,
                 shape_str(residual.sizes()), shape_str(out_sizes));
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

// Inputs: residual, x, w1, b1, w2, b2, gamma. Saved: x, fc1's pre-activation h, fc2's output before gamma.
class MlpScaleResidualBackward final : public Node {
 public:
  MlpScaleResidualBackward(const Tensor& x2d, const Tensor& h, const Tensor& y2, const Tensor& w1,
                           const Tensor& w2, const Tensor& gamma, Shape x_sizes)
      : x_(x2d), h_(h), y2_(y2), w1_(w1), w2_(w2), gamma_(gamma), x_sizes_(std::move(x_sizes)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor x = x_.get(), h = h_.get(), y2 = y2_.get(), w1 = w1_.get(), w2 = w2_.get(),
                 gamma = gamma_.get();
    const Tensor g = grads[0].contiguous().view({x.size(0), x.size(1)});
    Tensor dx = needs_input_grad(1) ? empty_like(x) : Tensor();
    Tensor dw1 = needs_input_grad(2) ? empty_like(w1) : Tensor();
    Tensor db1 = needs_input_grad(3) ? empty({w1.size(0)}, w1.dtype(), w1.device()) : Tensor();
    Tensor dw2 = needs_input_grad(4) ? empty_like(w2) : Tensor();
    Tensor db2 = needs_input_grad(5) ? empty({w2.size(0)}, w2.dtype(), w2.device()) : Tensor();
    Tensor dgamma = needs_input_grad(6) ? empty_like(gamma) : Tensor();
    if (g.is_cpu()) {
      cpu::mlp_scale_residual_backward(g, x, h, y2, w1, w2, gamma, dx, dw1, db1, dw2, db2, dgamma);
    } else {
      const Stream s = ops::stream_of(g);
      Tensor gb = empty_like(y2);
      CZ_CUDA_CALL(cuda::channel_scale_backward(g, y2, gamma, gb, dgamma, s));
      Tensor y = empty_like(h);
      CZ_CUDA_CALL(cuda::gelu_forward(h, y, s));
      const bool fc1 = dx.defined() || dw1.defined() || db1.defined();
      Tensor da = fc1 ? empty_like(h) : Tensor();
      CZ_CUDA_CALL(cuda::linear_backward(gb, y, w2, da, dw2, db2, s));
      if (fc1) {
        Tensor gh = empty_like(h);
        CZ_CUDA_CALL(cuda::gelu_backward(da, h, gh, s));
        CZ_CUDA_CALL(cuda::linear_backward(gh, x, w1, dx, dw1, db1, s));
      }
    }
    return {needs_input_grad(0) ? grads[0] : Tensor(),
            dx.defined() ? dx.view(x_sizes_) : dx,
            dw1,
            db1,
            dw2,
            db2,
            dgamma};
  }
  std::string name() const override { return "MlpScaleResidualBackward"; }
  void release_saved() override {
    x_.reset();
    h_.reset();
    y2_.reset();
    w1_.reset();
    w2_.reset();
    gamma_.reset();
  }

 private:
  SavedTensor x_, h_, y2_, w1_, w2_, gamma_;
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
  check_scale_residual(op, gamma, residual, x, out_sizes);
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

Tensor mlp_scale_residual(const Tensor& residual, const Tensor& x, const Tensor& w1, const Tensor& b1,
                          const Tensor& w2, const Tensor& b2, const Tensor& gamma) {
  const char* op = "mlp_scale_residual";
  check_linear(op, x, w1, b1);
  const int64_t c = w1.size(1), hid = w1.size(0);
  ops::check_like(op, "w2", w2, "x", x);
  CZ_CHECK_SHAPE(w2.dim() == 2 && w2.size(0) == c && w2.size(1) == hid,
                 "{}: w2 has shape {}, expected ({}, {}) after w1 of shape {}", op, shape_str(w2.sizes()), c,
                 hid, shape_str(w1.sizes()));
  if (b2.defined()) {
    ops::check_like(op, "b2", b2, "x", x);
    CZ_CHECK_SHAPE(b2.dim() == 1 && b2.size(0) == c, "{}: b2 has shape {}, expected ({})", op,
                   shape_str(b2.sizes()), c);
  }
  check_scale_residual(op, gamma, residual, x, x.sizes());
  profiler::Scope prof(op, x.device());
  const Tensor x2d = x.contiguous().detach().view({-1, c});
  const Tensor w1c = w1.contiguous(), w2c = w2.contiguous(), rc = residual.contiguous();
  const int64_t rows = x2d.size(0);
  const bool grad = should_record({&residual, &x, &w1, &b1, &w2, &b2, &gamma});
  // Backward's: fc1's pre-activation and fc2's output before gamma (not kept when no graph is recorded).
  Tensor h = grad ? empty({rows, hid}, x.dtype(), x.device()) : Tensor();
  Tensor y2 = grad ? empty({rows, c}, x.dtype(), x.device()) : Tensor();
  Tensor out = empty(x.sizes(), x.dtype(), x.device());
  Tensor out2d = out.view({rows, c});
  const Tensor r2d = rc.view({rows, c});
  if (x.is_cpu()) {
    cpu::mlp_scale_residual_forward(x2d, w1c, b1, w2c, b2, gamma, r2d, h, y2, out2d);
  } else {
    const Stream s = ops::stream_of(x);
    Tensor hh = grad ? h : empty({rows, hid}, x.dtype(), x.device());
    CZ_CUDA_CALL(cuda::linear_forward(x2d, w1c, b1, hh, s));
    Tensor y = empty({rows, hid}, x.dtype(), x.device());
    CZ_CUDA_CALL(cuda::gelu_forward(hh, y, s));
    Tensor z = grad ? y2 : empty({rows, c}, x.dtype(), x.device());
    CZ_CUDA_CALL(cuda::linear_forward(y, w2c, b2, z, s));
    CZ_CUDA_CALL(cuda::residual_scale_add(r2d, z, gamma, out2d, s));
  }
  if (grad)
    record(std::make_shared<MlpScaleResidualBackward>(x2d, h, y2, w1c, w2c, gamma, x.sizes()),
           {&residual, &x, &w1, &b1, &w2, &b2, &gamma}, {&out});
  return out;
}

bool mlp_as_one_op(bool cuda, int64_t channels, int64_t hidden) {
  return !cuda && channels * hidden <= (int64_t(1) << 16);
}

}  // namespace cz
