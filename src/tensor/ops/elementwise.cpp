// Elementwise ops: validation, dispatch and backward rules.
#include "tensor/ops/elementwise.h"

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

class AddBackward final : public Node {
 public:
  explicit AddBackward(double alpha) : alpha_(alpha) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor gb;
    if (needs_input_grad(1)) gb = alpha_ == 1.0 ? g[0] : scale(g[0], alpha_);
    return {g[0], gb};
  }
  std::string name() const override { return alpha_ == 1.0 ? "AddBackward" : "SubBackward"; }

 private:
  double alpha_;
};

class MulBackward final : public Node {
 public:
  MulBackward(const Tensor& a, const Tensor& b) : a_(a), b_(b) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = mul(g[0], b_.get());
    if (needs_input_grad(1)) gb = mul(g[0], a_.get());
    return {ga, gb};
  }
  std::string name() const override { return "MulBackward"; }
  void release_saved() override {
    a_.reset();
    b_.reset();
  }

 private:
  SavedTensor a_, b_;
};

class ScaleBackward final : public Node {
 public:
  explicit ScaleBackward(double f) : f_(f) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {scale(g[0], f_)}; }
  std::string name() const override { return "ScaleBackward"; }

 private:
  double f_;
};

// Shared by channel_scale (inputs x, gamma) and residual_scale_add (inputs residual, x, gamma).
class ChannelScaleBackward final : public Node {
 public:
  ChannelScaleBackward(const Tensor& x, const Tensor& gamma, bool with_residual)
      : x_(x), gamma_(gamma), residual_(with_residual) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const size_t ix = residual_ ? 1 : 0, ig = ix + 1;
    const Tensor g = grads[0].contiguous();
    const Tensor x = x_.get(), gamma = gamma_.get();
    Tensor dx = needs_input_grad(ix) ? empty_like(x) : Tensor();
    Tensor dgamma = needs_input_grad(ig) ? empty_like(gamma) : Tensor();
    if (g.is_cpu())
      cpu::channel_scale_backward(g, x, gamma, dx, dgamma);
    else
      CZ_CUDA_CALL(cuda::channel_scale_backward(g, x, gamma, dx, dgamma, ops::stream_of(g)));
    if (residual_) return {needs_input_grad(0) ? grads[0] : Tensor(), dx, dgamma};
    return {dx, dgamma};
  }
  std::string name() const override {
    return residual_ ? "ResidualScaleAddBackward" : "ChannelScaleBackward";
  }
  void release_saved() override {
    x_.reset();
    gamma_.reset();
  }

 private:
  SavedTensor x_, gamma_;
  bool residual_;
};

Tensor binary(const char* op, const Tensor& a, const Tensor& b, cpu::BinaryOp kind, double alpha) {
  ops::check_floating(op, "a", a);
  profiler::Scope prof(op, a.device());
  ops::check_same_shape(op, "a", a, "b", b);
  ops::check_cpu_compute_dtype(op, a);
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  Tensor out = empty_like(a);
  if (a.is_cpu())
    cpu::binary(kind, ac, bc, alpha, out);
  else
    CZ_CUDA_CALL(cuda::binary(kind, ac, bc, alpha, out, ops::stream_of(a)));
  return out;
}

void check_channel_scale(const char* op, const Tensor& x, const Tensor& gamma) {
  ops::check_floating(op, "x", x);
  ops::check_cpu_compute_dtype(op, x);
  ops::check_like(op, "gamma", gamma, "x", x);
  CZ_CHECK_SHAPE(x.dim() >= 1 && gamma.dim() == 1 && gamma.size(0) == x.size(-1),
                 "{}: gamma has shape {} but x has shape {} (gamma must be ({}))", op,
                 shape_str(gamma.sizes()), shape_str(x.sizes()), x.dim() >= 1 ? x.size(-1) : 0);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary("add", a, b, cpu::BinaryOp::add, 1.0);
  if (should_record({&a, &b})) record(std::make_shared<AddBackward>(1.0), {&a, &b}, {&out});
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary("sub", a, b, cpu::BinaryOp::add, -1.0);
  if (should_record({&a, &b})) record(std::make_shared<AddBackward>(-1.0), {&a, &b}, {&out});
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary("mul", a, b, cpu::BinaryOp::mul, 1.0);
  if (should_record({&a, &b})) record(std::make_shared<MulBackward>(a, b), {&a, &b}, {&out});
  return out;
}

Tensor scale(const Tensor& x, double factor) {
  ops::check_floating("scale", "x", x);
  profiler::Scope prof("scale", x.device());
  ops::check_cpu_compute_dtype("scale", x);
  Tensor out = x.contiguous().detach().clone();
  out.mul_(factor);
  if (should_record({&x})) record(std::make_shared<ScaleBackward>(factor), {&x}, {&out});
  return out;
}

Tensor channel_scale(const Tensor& x, const Tensor& gamma) {
  check_channel_scale("channel_scale", x, gamma);
  profiler::Scope prof("channel_scale", x.device());
  const Tensor xc = x.contiguous();
  Tensor out = empty_like(x);
  if (x.is_cpu())
    cpu::residual_scale_add(Tensor(), xc, gamma, out);
  else
    CZ_CUDA_CALL(cuda::residual_scale_add(Tensor(), xc, gamma, out, ops::stream_of(x)));
  if (should_record({&x, &gamma}))
    record(std::make_shared<ChannelScaleBackward>(xc, gamma, false), {&x, &gamma}, {&out});
  return out;
}

Tensor residual_scale_add(const Tensor& residual, const Tensor& x, const Tensor& gamma) {
  check_channel_scale("residual_scale_add", x, gamma);
  profiler::Scope prof("residual_scale_add", x.device());
  ops::check_same_shape("residual_scale_add", "x", x, "residual", residual);
  const Tensor xc = x.contiguous(), rc = residual.contiguous();
  Tensor out = empty_like(x);
  if (x.is_cpu())
    cpu::residual_scale_add(rc, xc, gamma, out);
  else
    CZ_CUDA_CALL(cuda::residual_scale_add(rc, xc, gamma, out, ops::stream_of(x)));
  if (should_record({&residual, &x, &gamma}))
    record(std::make_shared<ChannelScaleBackward>(xc, gamma, true), {&residual, &x, &gamma}, {&out});
  return out;
}

}  // namespace cz
