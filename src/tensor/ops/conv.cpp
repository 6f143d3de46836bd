// Depthwise and patchify convolutions: validation, dispatch and backward rules. Kernels take channels-last
// weights ((k, k, C) and (Cout, k, k, Cin)); the PyTorch-layout weights are transposed here (they are small).
#include "tensor/ops/conv.h"

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

// (C, 1, k, k) <-> (k, k, C).
Tensor depthwise_weight_to_kernel(const Tensor& w) {
  const int64_t C = w.size(0), k = w.size(2);
  return w.detach().reshape({C, k * k}).transpose(0, 1).contiguous().view({k, k, C});
}
Tensor depthwise_weight_from_kernel(const Tensor& wk) {
  const int64_t k = wk.size(0), C = wk.size(2);
  return wk.view({k * k, C}).transpose(0, 1).contiguous().view({C, 1, k, k});
}

class DepthwiseConvBackward final : public Node {
 public:
  DepthwiseConvBackward(const Tensor& x, const Tensor& wk) : x_(x), wk_(wk) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor x = x_.get(), wk = wk_.get(), gy = g[0].contiguous();
    Tensor dx = needs_input_grad(0) ? empty_like(x) : Tensor();
    Tensor dwk = needs_input_grad(1) ? empty_like(wk) : Tensor();
    Tensor db = needs_input_grad(2) ? empty({x.size(3)}, x.dtype(), x.device()) : Tensor();
    if (x.is_cpu())
      cpu::depthwise_conv2d_backward(gy, x, wk, dx, dwk, db);
    else
      CZ_CUDA_CALL(cuda::depthwise_conv2d_backward(gy, x, wk, dx, dwk, db, ops::stream_of(x)));
    return {dx, dwk.defined() ? depthwise_weight_from_kernel(dwk) : dwk, db};
  }
  std::string name() const override { return "DepthwiseConv2dBackward"; }
  void release_saved() override {
    x_.reset();
    wk_.reset();
  }

 private:
  SavedTensor x_, wk_;
};

class PatchifyConvBackward final : public Node {
 public:
  PatchifyConvBackward(const Tensor& x, const Tensor& wk) : x_(x), wk_(wk) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor x = x_.get(), wk = wk_.get(), gy = g[0].contiguous();
    Tensor dx = needs_input_grad(0) ? empty_like(x) : Tensor();
    Tensor dwk = needs_input_grad(1) ? empty_like(wk) : Tensor();
    Tensor db = needs_input_grad(2) ? empty({wk.size(0)}, x.dtype(), x.device()) : Tensor();
    if (x.is_cpu())
      cpu::patchify_conv2d_backward(gy, x, wk, dx, dwk, db);
    else
      CZ_CUDA_CALL(cuda::patchify_conv2d_backward(gy, x, wk, dx, dwk, db, ops::stream_of(x)));
    return {dx, dwk.defined() ? dwk.permute({0, 3, 1, 2}).contiguous() : dwk, db};
  }
  std::string name() const override { return "PatchifyConv2dBackward"; }
  void release_saved() override {
    x_.reset();
    wk_.reset();
  }

 private:
  SavedTensor x_, wk_;
};

void check_input(const char* op, const Tensor& x) {
  ops::check_floating(op, "x", x);
  ops::check_cpu_compute_dtype(op, x);
  ops::check_dim(op, "x", x, 4, "NHWC (N, H, W, C)");
}

void check_bias(const char* op, const Tensor& bias, int64_t channels, const Tensor& x) {
  if (!bias.defined()) return;
  ops::check_like(op, "bias", bias, "x", x);
  CZ_CHECK_SHAPE(bias.dim() == 1 && bias.size(0) == channels,
                 "{}: bias has shape {} but the output has {} channels", op, shape_str(bias.sizes()),
                 channels);
}

}  // namespace

Tensor depthwise_conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "depthwise_conv2d";
  check_input(op, x);
  profiler::Scope prof(op, x.device());
  ops::check_like(op, "weight", weight, "x", x);
  const int64_t C = x.size(3);
  CZ_CHECK_SHAPE(
      weight.dim() == 4 && weight.size(0) == C && weight.size(1) == 1 && weight.size(2) == weight.size(3),
      "depthwise_conv2d: weight has shape {} but x has C={} (shape {}); expected ({}, 1, k, k)",
      shape_str(weight.sizes()), C, shape_str(x.sizes()), C);
  CZ_CHECK_SHAPE(weight.size(2) % 2 == 1, "depthwise_conv2d: kernel size must be odd, weight has shape {}",
                 shape_str(weight.sizes()));
  check_bias(op, bias, C, x);
  const Tensor xc = x.contiguous().detach(), wk = depthwise_weight_to_kernel(weight);
  const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  Tensor out = empty(x.sizes(), x.dtype(), x.device());
  if (x.is_cpu())
    cpu::depthwise_conv2d_forward(xc, wk, bc, out);
  else
    CZ_CUDA_CALL(cuda::depthwise_conv2d_forward(xc, wk, bc, out, ops::stream_of(x)));
  if (should_record({&x, &weight, &bias}))
    record(std::make_shared<DepthwiseConvBackward>(xc, wk), {&x, &weight, &bias}, {&out});
  return out;
}

Tensor patchify_conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "patchify_conv2d";
  check_input(op, x);
  profiler::Scope prof(op, x.device());
  ops::check_like(op, "weight", weight, "x", x);
  const int64_t N = x.size(0), H = x.size(1), W = x.size(2), Cin = x.size(3);
  CZ_CHECK_SHAPE(
      weight.dim() == 4 && weight.size(1) == Cin && weight.size(2) == weight.size(3) && weight.size(2) > 0,
      "patchify_conv2d: weight has shape {} but x has Cin={} (shape {}); expected (Cout, {}, k, k)",
      shape_str(weight.sizes()), Cin, shape_str(x.sizes()), Cin);
  const int64_t Cout = weight.size(0), k = weight.size(2);
  CZ_CHECK_SHAPE(H >= k && W >= k,
                 "patchify_conv2d: kernel {}x{} (weight {}) is larger than the input {}x{} (x {})", k, k,
                 shape_str(weight.sizes()), H, W, shape_str(x.sizes()));
  check_bias(op, bias, Cout, x);
  const Tensor xc = x.contiguous().detach(), wk = weight.detach().permute({0, 2, 3, 1}).contiguous();
  const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  Tensor out = empty({N, H / k, W / k, Cout}, x.dtype(), x.device());
  if (x.is_cpu())
    cpu::patchify_conv2d_forward(xc, wk, bc, out);
  else
    CZ_CUDA_CALL(cuda::patchify_conv2d_forward(xc, wk, bc, out, ops::stream_of(x)));
  if (should_record({&x, &weight, &bias}))
    record(std::make_shared<PatchifyConvBackward>(xc, wk), {&x, &weight, &bias}, {&out});
  return out;
}

}  // namespace cz
