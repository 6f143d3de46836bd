// The device and precision entries of the flag table (flags.h).
#include "dist/train/flags_table.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dist/comm/mesh.h"
#include "dist/train/cpu_gemm_setup.h"
#include "dist/train/recipe.h"
#include "dist/train/step_tracer.h"
#include "dist/zero/schedule.h"
#include "tensor/check.h"
#include "tensor/cpu/row_tiles.h"

namespace cz::train {

std::vector<Flag> device_flags() {
  using C = const TrainConfig&;
  using F = const Flag&;
  using T = TrainConfig;
  return {
      {.name = "--precision",
       .field = &T::precision,
       .group = kDeviceGroup,
       .help =
           "fp32 | fp16 | bf16 (fp32 master weights; CUDA: the model runs in 16 bits; CPU: bf16 only, the "
           "GEMMs multiply bf16-rounded operands on AMX or AVX512_BF16 with fp32 accumulation, the rest "
           "stays fp32; refused where the CPU has neither)",
       .check =
           [](C c, F f) {
             CZ_CHECK(is_dtype_flag(c.precision), "{} must be fp32, fp16 or bf16, got '{}'", f.name,
                      c.precision);
           },
       .ranks_agree = true,
       .json_key = "precision"},
      {.name = "--initial-loss-scale",
       .field = &T::initial_loss_scale,
       .group = kDeviceGroup,
       .help =
           "fp16: the dynamic loss scale to start from (halved on overflow, doubled after 2000 clean steps)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.initial_loss_scale) && c.initial_loss_scale >= 1,
                      "{} must be a finite number >= 1, got {}", f.name, c.initial_loss_scale);
           }},
      {.name = "--activation-checkpointing",
       .field = &T::activation_checkpointing,
       .group = kDeviceGroup,
       .help = "recompute block activations in backward",
       .ranks_agree = true},
      {.name = "--device",
       .field = &T::device,
       .group = kDeviceGroup,
       .help = "cpu | cuda[:N] (N: the GPU of a single process; under mpirun each rank takes GPU local_rank "
               "mod the GPU count)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.device == "cpu" || c.device.rfind("cuda", 0) == 0,
                      "{} must be cpu or cuda[:N], got '{}'", f.name, c.device);
           }},
      {.name = "--tf32",
       .field = &T::tf32,
       .group = kDeviceGroup,
       .help = "CUDA: allow TF32 tensor cores for fp32 matmuls"},
      {.name = "--cpu-gemm",
       .field = &T::cpu_gemm,
       .group = kDeviceGroup,
       .help =
           "auto | openblas | onednn | blis | libxsmm: the library of the CPU's f32 GEMMs (auto: per shape, "
           "the fastest measured on this machine, kept in a cache file; docs/performance.md)",
       .check =
           [](C c, F f) {
             const std::vector<std::string> ok = cpu_gemm_choices();
             CZ_CHECK(std::find(ok.begin(), ok.end(), c.cpu_gemm) != ok.end(),
                      "{} must be one of {}, got '{}'", f.name, fmt::join(ok, ", "), c.cpu_gemm);
           },
       .ranks_agree = true},
      {.name = "--cpu-row-split",
       .field = &T::cpu_row_split,
       .group = kDeviceGroup,
       .help =
           "fast | fixed | rows:N: how the CPU kernels cut a batch's rows into GEMM calls and sums (fast: by "
           "the thread count; fixed: by the layer's shape, the same bits at any thread count; rows:N: "
           "pieces of N rows, and where N divides every rank's share of every layer, N ranks compute "
           "what one rank computes bit for bit; slower; docs/training.md)",
       .check =
           [](C c, F f) {
             CZ_CHECK(cpu::parse_row_split(c.cpu_row_split).has_value(),
                      "{} must be fast, fixed or rows:N with N >= 1, got '{}'", f.name, c.cpu_row_split);
           },
       .ranks_agree = true},
      {.name = "--cuda-graphs",
       .field = &T::cuda_graphs,
       .group = kDeviceGroup,
       .help = "auto | on | off: replay each micro-step's forward, loss and backward from a CUDA graph "
               "(auto: where the run allows it, else off with the reason in the header; on: refused, naming "
               "the reason, where it does not; docs/cuda.md)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.cuda_graphs == "auto" || c.cuda_graphs == "on" || c.cuda_graphs == "off",
                      "{} must be auto, on or off, got '{}'", f.name, c.cuda_graphs);
             CZ_CHECK(c.cuda_graphs != "on" || c.device.rfind("cuda", 0) == 0,
                      "{} on needs {} cuda (CUDA graphs record GPU kernels); {} is {}", f.name,
                      flag_name(&T::device), flag_name(&T::device), c.device);
           },
       .ranks_agree = true},
  };
}

}  // namespace cz::train
