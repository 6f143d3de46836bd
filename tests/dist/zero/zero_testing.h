// Shared by the ZeRO engine's tests (test_zero.cpp, test_zero_quant.cpp, test_offload.cpp,
// test_grad_zero.cpp): the small model the multi-rank ones train, the toy module the world-of-one ones build,
// and the weights as one vector.
#pragma once

#include <vector>

#include "dist/train/config.h"
#include "nn/module.h"
#include "tensor/ops.h"

namespace cz::train::testing {

// A model whose parameter count (with 5 classes) divides by neither 2 nor 4, and buckets of ~10 KiB, so that
// chunks straddle parameters and several buckets are in flight; tensors of every size class (layer-scale
// gammas of 8 values beside 1-D biases and 4-D convolutions).
inline TrainConfig zero_config(int stage) {
  TrainConfig c;
  c.depths = {1, 1, 2, 1};
  c.dims = {8, 16, 24, 32};
  c.num_classes = 5;
  c.image_size = 32;
  c.data = "synthetic:n=512,eval_n=64,classes=5";
  c.micro_batch = 4;
  c.grad_accum = 2;
  c.clip_grad = 1;
  c.ema_decay = 0.99;
  c.drop_path = 0.1;
  c.steps = 10;
  c.lr = 3e-3;
  c.loader_threads = 0;
  c.progress = false;
  c.seed = 11;
  c.stage = stage;
  c.bucket_mb = 0.01;
  return c;
}

// Every parameter's values, one parameter after another (master_parameters() of a trainer or an engine).
inline std::vector<float> flat_values(const nn::NamedParameters& params) {
  std::vector<float> out;
  for (const auto& [name, p] : params) {
    const auto v = p.contiguous().to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// x * w for a weight of n values, all 0.5 at first.
class Scale : public nn::Module {
 public:
  explicit Scale(int64_t n) : Module("Scale") { w_ = register_parameter("weight", full({n}, 0.5)); }
  Tensor forward(const Tensor& x) override { return mul(x, w_); }
  const Tensor& weight() const { return w_; }

 private:
  Tensor w_;
};

}  // namespace cz::train::testing
