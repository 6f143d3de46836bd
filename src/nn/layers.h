// The layers ConvNeXt is made of. Activations are NHWC; weights keep PyTorch's shapes so state dicts map 1:1.
#pragma once

#include "nn/module.h"
#include "tensor/random.h"

namespace cz::nn {

struct ParamOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
};

// x: (..., in) -> (..., out). weight (out, in), bias (out).
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, ParamOptions opt = {});
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

 private:
  Tensor weight_, bias_;
};

// Depthwise k x k, stride 1, padding k/2. x: (N, H, W, C). weight (C, 1, k, k), bias (C).
class DepthwiseConv2d : public Module {
 public:
  DepthwiseConv2d(int64_t channels, int64_t kernel = 7, bool bias = true, ParamOptions opt = {});
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return weight_; }

 private:
  Tensor weight_, bias_;
};

// kernel = stride = k. x: (N, H, W, Cin) -> (N, H/k, W/k, Cout). weight (Cout, Cin, k, k), bias (Cout).
class PatchifyConv2d : public Module {
 public:
  PatchifyConv2d(int64_t in, int64_t out, int64_t kernel, bool bias = true, ParamOptions opt = {});
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return weight_; }

 private:
  Tensor weight_, bias_;
};

// Over the last (channel) dimension. weight (C) = 1, bias (C) = 0.
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t channels, double eps = 1e-6, ParamOptions opt = {});
  Tensor forward(const Tensor& x) override;

 private:
  Tensor weight_, bias_;
  double eps_;
};

// ConvNeXt V2's Global Response Normalization over (N, H, W, C) (grn op, timm's GlobalResponseNorm):
// weight (C) and bias (C), both 0 at construction as timm's, so the layer starts as the identity.
class GlobalResponseNorm : public Module {
 public:
  static constexpr double kEps = 1e-6;  // timm's
  GlobalResponseNorm(int64_t channels, ParamOptions opt = {});
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

 private:
  Tensor weight_, bias_;
};

class GELU : public Module {
 public:
  GELU() : Module("GELU") {}
  Tensor forward(const Tensor& x) override;
};

// (N, H, W, C) -> (N, C).
class GlobalAvgPool : public Module {
 public:
  GlobalAvgPool() : Module("GlobalAvgPool") {}
  Tensor forward(const Tensor& x) override;
};

// Initialises like timm's ConvNeXt: truncated normal (std 0.02, bounds +-2) for conv and linear weights, zero
// biases; LayerNorm weight 1, bias 0; GlobalResponseNorm weight and bias 0. Draws from `gen` in parameter
// order.
void init_weights_timm(Module& m, Generator& gen);

}  // namespace cz::nn
