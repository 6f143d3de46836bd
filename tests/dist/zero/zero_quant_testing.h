// What the quantized ZeRO tests share (test_zero_quant.cpp, test_zero_quant_mesh.cpp): the block size, the
// tests' configuration, the masters, the quantizer's round trip applied here, and a check of every forward's
// compute copy against it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "dist/comm/bootstrap.h"
#include "dist/comm/communicator.h"
#include "dist/comm/mesh.h"
#include "dist/comm/quant.h"
#include "dist/train/trainer.h"
#include "dist/zero/gather_codec.h"
#include "dist/zero/quant_reduce.h"
#include "dist/zero/quant_reduce_hier.h"
#include "tensor/half.h"
#include "tensor/ops.h"
#include "zero_testing.h"

namespace cz::train::quant_testing {

constexpr int64_t kBlock = 256;

inline dist::World& world() {
  return dist::World::get();
}

// test_zero.cpp's model (zero_testing.h), 4 steps, no EMA.
inline TrainConfig quant_config(int stage, const std::string& gather) {
  TrainConfig c = testing::zero_config(stage);
  c.ema_decay = 0;
  c.steps = 4;
  c.gather_dtype = gather;
  return c;
}

// The fp32 master of each parameter, by name (all-gathered on every rank).
inline std::map<std::string, std::vector<float>> masters(Trainer& t) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, p] : t.master_parameters()) out[name] = p.contiguous().to_vector<float>();
  return out;
}

// What the compute copy must hold: each tensor quantized on its own, blocks from its first value (the layout
// aligns every parameter to the block size, so a block never mixes two tensors).
inline std::vector<float> round_trip(const std::vector<float>& x, bool bf16 = false) {
  const int64_t n = int64_t(x.size());
  if (bf16) {
    std::vector<float> y;
    for (float v : x) y.push_back(float(BFloat16(v)));
    return y;
  }
  std::vector<int8_t> q(x.size());
  std::vector<float> s(size_t(dist::quant_scale_count(n, kBlock))), y(x.size());
  dist::quantize(DType::f32, x.data(), n, kBlock, q.data(), s.data());
  dist::dequantize(q.data(), s.data(), n, kBlock, DType::f32, y.data());
  return y;
}

// Hooks on every module that holds parameters, registered after the engine's (which gather the unit first):
// each forward compares the module's parameters, bit for bit, with the round trip of the master they came
// from.
class ComputeCopyCheck {
 public:
  explicit ComputeCopyCheck(Trainer& t, bool bf16 = false) : t_(t), bf16_(bf16) {
    for (auto& [prefix, m] : t.model().named_modules()) {
      if (m->local_parameters().empty()) continue;
      const std::string pre = prefix.empty() ? "" : prefix + ".";
      hooks_.emplace_back(m, m->register_forward_pre_hook([this, m, pre](nn::Module&, const Tensor&) {
        for (const auto& [local, p] : m->local_parameters()) {
          const auto it = expected_.find(pre + local);
          ASSERT_NE(it, expected_.end()) << pre + local;
          const std::vector<float> got = p.contiguous().to_vector<float>();
          ++checked_;
          if (std::memcmp(got.data(), it->second.data(), got.size() * sizeof(float)) != 0) ++wrong_;
        }
      }));
    }
  }
  ~ComputeCopyCheck() {
    for (auto& [m, id] : hooks_) m->remove_hook(id);
  }
  // Before a step: what its forwards must see.
  void expect_from_master() {
    expected_.clear();
    moved_ = 0;
    for (auto& [name, w] : masters(t_)) {
      expected_[name] = round_trip(w, bf16_);
      for (size_t i = 0; i < w.size(); ++i) moved_ += expected_[name][i] != w[i];
    }
  }
  int64_t checked_ = 0, wrong_ = 0, moved_ = 0;

 private:
  Trainer& t_;
  bool bf16_;
  std::map<std::string, std::vector<float>> expected_;
  std::vector<std::pair<nn::Module*, int>> hooks_;
};

// A reduction test's inputs: rank r's value i, in blocks of very different peaks (a tiny one like a layer
// scale's gradient among them); inputs_of: rank r's bucket of `count` values.
inline float input_value(int rank, int64_t i) {
  const double peak = (i / 256) % 3 == 0 ? 1e-6 : (i / 256) % 3 == 1 ? 0.3 : 20.0;
  return float(peak * std::sin(0.37 * double(i) + 1.3 * rank + 0.01 * double(i % 97) * rank));
}
inline std::vector<float> inputs_of(int rank, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[size_t(i)] = input_value(rank, i);
  return v;
}

}  // namespace cz::train::quant_testing
