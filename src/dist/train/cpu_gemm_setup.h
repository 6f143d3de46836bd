// --cpu-gemm: which library runs each CPU GEMM shape of the run, chosen once at start (Note [CPU GEMM
// libraries] in src/tensor/cpu/gemm_choice.cpp).
#pragma once

#include <string>
#include <vector>

#include "dist/comm/process_group.h"
#include "nn/convnext.h"

namespace cz::train {

// The values --cpu-gemm takes: "auto" and the library names.
std::vector<std::string> cpu_gemm_choices();

struct CpuGemmSetup {
  std::string note;                   // for the header line: what runs where, and what the choice cost
  std::vector<std::string> warnings;  // rank 0's: a corrupt or unusable cache file
};

// Sets the process's GEMM plan for `choice` ("auto" or a library). With auto, rank 0 of `control` looks up
// (measuring what the cache lacks) the step's GEMM shapes at `micro_batch` images of `image` pixels and sends
// its table to every rank, so that all ranks run each shape on the same library.
CpuGemmSetup setup_cpu_gemms(const std::string& choice, const nn::ConvNeXtConfig& model, int64_t image,
                             int64_t micro_batch, const dist::ProcessGroup& control);

}  // namespace cz::train
