// Layer constructors (parameter shapes) and forwards.
#include "nn/layers.h"

#include "tensor/autograd/engine.h"
#include "tensor/ops.h"

namespace cz::nn {
namespace {
void check_positive(const char* layer, const char* what, int64_t v) {
  CZ_CHECK(v > 0, "{}: {} must be positive, got {}", layer, what, v);
}
}  // namespace

Linear::Linear(int64_t in, int64_t out, bool bias, ParamOptions opt) : Module("Linear") {
  check_positive("Linear", "in_features", in);
  check_positive("Linear", "out_features", out);
  weight_ = register_parameter("weight", zeros({out, in}, opt.dtype, opt.device));
  if (bias) bias_ = register_parameter("bias", zeros({out}, opt.dtype, opt.device));
}
Tensor Linear::forward(const Tensor& x) {
  return linear(x, weight_, bias_);
}

DepthwiseConv2d::DepthwiseConv2d(int64_t channels, int64_t kernel, bool bias, ParamOptions opt)
    : Module("DepthwiseConv2d") {
  check_positive("DepthwiseConv2d", "channels", channels);
  CZ_CHECK(kernel > 0 && kernel % 2 == 1, "DepthwiseConv2d: kernel must be odd and positive, got {}", kernel);
  weight_ = register_parameter("weight", zeros({channels, 1, kernel, kernel}, opt.dtype, opt.device));
  if (bias) bias_ = register_parameter("bias", zeros({channels}, opt.dtype, opt.device));
}
Tensor DepthwiseConv2d::forward(const Tensor& x) {
  return depthwise_conv2d(x, weight_, bias_);
}

PatchifyConv2d::PatchifyConv2d(int64_t in, int64_t out, int64_t kernel, bool bias, ParamOptions opt)
    : Module("PatchifyConv2d") {
  check_positive("PatchifyConv2d", "in_channels", in);
  check_positive("PatchifyConv2d", "out_channels", out);
  check_positive("PatchifyConv2d", "kernel", kernel);
  weight_ = register_parameter("weight", zeros({out, in, kernel, kernel}, opt.dtype, opt.device));
  if (bias) bias_ = register_parameter("bias", zeros({out}, opt.dtype, opt.device));
}
Tensor PatchifyConv2d::forward(const Tensor& x) {
  return patchify_conv2d(x, weight_, bias_);
}

LayerNorm::LayerNorm(int64_t channels, double eps, ParamOptions opt) : Module("LayerNorm"), eps_(eps) {
  check_positive("LayerNorm", "channels", channels);
  CZ_CHECK(eps > 0, "LayerNorm: eps must be positive, got {}", eps);
  weight_ = register_parameter("weight", ones({channels}, opt.dtype, opt.device));
  bias_ = register_parameter("bias", zeros({channels}, opt.dtype, opt.device));
}
Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, weight_, bias_, eps_);
}

GlobalResponseNorm::GlobalResponseNorm(int64_t channels, ParamOptions opt) : Module("GlobalResponseNorm") {
  check_positive("GlobalResponseNorm", "channels", channels);
  weight_ = register_parameter("weight", zeros({channels}, opt.dtype, opt.device));
  bias_ = register_parameter("bias", zeros({channels}, opt.dtype, opt.device));
}
Tensor GlobalResponseNorm::forward(const Tensor& x) {
  return grn(x, weight_, bias_, kEps);
}

Tensor GELU::forward(const Tensor& x) {
  return gelu(x);
}
Tensor GlobalAvgPool::forward(const Tensor& x) {
  return global_avg_pool(x);
}

void init_weights_timm(Module& root, Generator& gen) {
  NoGradGuard no_grad;
  for (auto& [name, m] : root.named_modules()) {
    const bool conv_or_linear =
        dynamic_cast<Linear*>(m) || dynamic_cast<DepthwiseConv2d*>(m) || dynamic_cast<PatchifyConv2d*>(m);
    for (auto& [pname, p] : m->local_parameters()) {
      Tensor t = p;
      if (conv_or_linear && pname == "weight")
        trunc_normal_(t, 0.0, 0.02, -2.0, 2.0, gen);
      else if (conv_or_linear && pname == "bias")
        t.zero_();
      else if (dynamic_cast<LayerNorm*>(m))
        t.fill_(pname == "weight" ? 1.0 : 0.0);
      else if (dynamic_cast<GlobalResponseNorm*>(m))
        t.zero_();
    }
  }
}

}  // namespace cz::nn
