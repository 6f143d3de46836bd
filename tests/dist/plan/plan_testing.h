// What the planner's and the what-if's tests share: the runs they ask about, described as the flags would.
#pragma once

#include <cstdint>
#include <string>

#include "dist/train/config.h"

namespace cz::plan::testing {

// `model` on 224 px images, micro-batch `micro_batch`, bf16 on CUDA: the run most questions are about.
inline train::TrainConfig cuda_bf16_run(const std::string& model, int64_t micro_batch) {
  train::TrainConfig c;
  c.model = model;
  c.image_size = 224;
  c.micro_batch = micro_batch;
  c.device = "cuda";
  c.precision = "bf16";
  return c;
}

}  // namespace cz::plan::testing
