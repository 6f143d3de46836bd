// Shared by the ZeRO engine's multi-rank tests (test_zero.cpp, test_zero_quant.cpp): the small model they
// train.
#pragma once

#include "dist/train/config.h"

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

}  // namespace cz::train::testing
