// Shared by the trainer tests (CPU and CUDA): a single-process world, a small model on small synthetic
// images, and comparisons of master weights.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dist/comm/bootstrap.h"
#include "dist/train/trainer.h"

namespace cz::train::testing {

class WorldEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { dist::World::init(nullptr, nullptr); }
  void TearDown() override { dist::World::finalize(); }
};

inline std::filesystem::path temp_dir() {
  std::filesystem::path d = std::filesystem::temp_directory_path() / fmt::format("cz_train_{}", ::getpid());
  std::filesystem::create_directories(d);
  return d;
}

// A small ConvNeXt on small synthetic images: a step takes milliseconds on one core.
inline TrainConfig tiny_config() {
  TrainConfig c;
  c.depths = {1, 1, 1, 1};
  c.dims = {8, 16, 24, 32};
  c.num_classes = 4;
  c.image_size = 32;
  c.data = "synthetic:n=256,eval_n=64,classes=4";
  c.micro_batch = 16;
  c.steps = 3;
  c.lr = 2e-3;
  c.warmup_steps = 0;
  c.loader_threads = 1;
  c.progress = false;
  c.seed = 7;
  return c;
}

// Long enough to learn the synthetic task well above chance (top-1 > 0.6 of 4 classes).
inline TrainConfig learning_config() {
  TrainConfig c = tiny_config();
  c.steps = 60;
  c.lr = 4e-3;
  c.warmup_steps = 5;
  return c;
}

// Every master weight, parameter after parameter (collective at stages 1-3).
inline std::vector<float> master_values(Trainer& t) {
  std::vector<float> out;
  for (const auto& [name, p] : t.master_parameters()) {
    const std::vector<float> v = p.to(Device::cpu()).contiguous().to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

}  // namespace cz::train::testing
