// Every GEMM of a ConvNeXt training step on the CPU, from the config alone: what the CPU GEMM choice measures
// at start and bench/bench_gemm_cpu times (Note [CPU GEMM libraries]).
#pragma once

#include <string>
#include <vector>

#include "nn/convnext.h"
#include "tensor/cpu/gemm_choice.h"

namespace cz::nn {

struct NamedGemm {
  std::string name;  // "stage 0 fc1 forward", "stem weight grad", ...
  cpu::GemmShape shape;
  int64_t calls = 1;  // per step: the blocks of a stage share their shapes
};

// The GEMMs of one forward and backward at `batch` images of `image` x `image`, as the CPU kernels call
// gemm<T>: linear layers (src/tensor/cpu/linear.cpp: forward NT, input gradient NN, weight gradient TN over
// the rows) and the patchify convolutions (src/tensor/cpu/conv.cpp: the same three on im2col patches of
// k*k*Cin columns; the stem has no input gradient). Shapes that occur more than once (a stage's blocks) are
// listed once, with `calls`.
std::vector<NamedGemm> convnext_step_gemms(const ConvNeXtConfig& cfg, int64_t image, int64_t batch);

// Their distinct shapes.
std::vector<cpu::GemmShape> distinct_gemm_shapes(const std::vector<NamedGemm>& gemms);

}  // namespace cz::nn
