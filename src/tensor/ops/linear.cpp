// matmul and linear: validation, dispatch and backward rules.
#include "tensor/ops/linear.h"

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

class MatmulBackward final : public Node {
 public:
  MatmulBackward(const Tensor& a, const Tensor& b) : a_(a), b_(b) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor gy = g[0].contiguous();
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = matmul(gy, b_.get().transpose(0, 1).contiguous());
    if (needs_input_grad(1)) gb = matmul(a_.get().transpose(0, 1).contiguous(), gy);
    return {ga, gb};
  }
  std::string name() const override { return "MatmulBackward"; }
  void release_saved() override {
    a_.reset();
    b_.reset();
  }

 private:
  SavedTensor a_, b_;
};

class LinearBackward final : public Node {
 public:
  LinearBackward(const Tensor& x2d, const Tensor& w, Shape x_sizes)
      : x_(x2d), w_(w), x_sizes_(std::move(x_sizes)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor w = w_.get(), x = x_.get();
    const Tensor gy = g[0].contiguous().view({x.size(0), w.size(0)});
    Tensor dx = needs_input_grad(0) ? empty_like(x) : Tensor();
    Tensor dw = needs_input_grad(1) ? empty_like(w) : Tensor();
    Tensor db = needs_input_grad(2) ? empty({w.size(0)}, w.dtype(), w.device()) : Tensor();
    if (gy.is_cpu())
      cpu::linear_backward(gy, x, w, dx, dw, db);
    else
      CZ_CUDA_CALL(cuda::linear_backward(gy, x, w, dx, dw, db, ops::stream_of(gy)));
    return {dx.defined() ? dx.view(x_sizes_) : dx, dw, db};
  }
  std::string name() const override { return "LinearBackward"; }
  void release_saved() override {
    x_.reset();
    w_.reset();
  }

 private:
  SavedTensor x_, w_;
  Shape x_sizes_;
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  ops::check_floating("matmul", "a", a);
  profiler::Scope prof("matmul", a.device());
  ops::check_cpu_compute_dtype("matmul", a);
  ops::check_like("matmul", "b", b, "a", a);
  CZ_CHECK_SHAPE(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
                 "matmul: shapes {} and {} cannot be multiplied (need (M, K) and (K, N))",
                 shape_str(a.sizes()), shape_str(b.sizes()));
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  Tensor out = empty({a.size(0), b.size(1)}, a.dtype(), a.device());
  if (a.is_cpu())
    cpu::matmul(ac, bc, out);
  else
    CZ_CUDA_CALL(cuda::matmul(ac, bc, out, ops::stream_of(a)));
  if (should_record({&a, &b})) record(std::make_shared<MatmulBackward>(ac, bc), {&a, &b}, {&out});
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  ops::check_floating("linear", "x", x);
  profiler::Scope prof("linear", x.device());
  ops::check_cpu_compute_dtype("linear", x);
  ops::check_like("linear", "weight", weight, "x", x);
  CZ_CHECK_SHAPE(weight.dim() == 2, "linear: weight must be (out, in), got {}", shape_str(weight.sizes()));
  CZ_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) == weight.size(1),
                 "linear: input has {} features (shape {}) but weight {} expects {}",
                 x.dim() ? x.size(-1) : 0, shape_str(x.sizes()), shape_str(weight.sizes()), weight.size(1));
  if (bias.defined()) {
    ops::check_like("linear", "bias", bias, "x", x);
    CZ_CHECK_SHAPE(bias.dim() == 1 && bias.size(0) == weight.size(0),
                   "linear: bias has shape {}, expected ({})", shape_str(bias.sizes()), weight.size(0));
  }
  const int64_t in = weight.size(1), out_features = weight.size(0);
  const Tensor x2d = x.contiguous().detach().view({-1, in});
  const Tensor wc = weight.contiguous();
  Shape out_sizes = x.sizes();
  out_sizes.back() = out_features;
  Tensor out = empty(out_sizes, x.dtype(), x.device());
  Tensor out2d = out.view({x2d.size(0), out_features});
  if (x.is_cpu())
    cpu::linear_forward(x2d, wc, bias, out2d);
  else
    CZ_CUDA_CALL(cuda::linear_forward(x2d, wc, bias, out2d, ops::stream_of(x)));
  if (should_record({&x, &weight, &bias}))
    record(std::make_shared<LinearBackward>(x2d, wc, x.sizes()), {&x, &weight, &bias}, {&out});
  return out;
}

}  // namespace cz
