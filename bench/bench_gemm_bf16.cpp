// The GEMMs of a ConvNeXt training step on the CPU, fp32 (cz::cpu::gemm<float> as it stands) against bf16
// (Note [bf16 on the CPU]: operands rounded to bf16, oneDNN's AMX or AVX512_BF16 matmul, fp32 accumulation),
// interleaved in one run: GFLOP/s of each and their ratio, per shape. The rounding passes are inside the bf16
// time. Shapes: ConvNeXt-atto at 64 px, batch 32 (default) or ConvNeXt-T at 224 px, batch 16 (--tiny).
//   bench_gemm_bf16 [--tiny] [--seconds 0.3]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/cpu/blas.h"
#include "tensor/cpu/cpu_features.h"
#include "tensor/cpu/gemm_bf16.h"
#include "tensor/parallel.h"

namespace cz {
namespace {

struct Gemm {
  std::string name;
  bool ta, tb;
  int64_t m, n, k;
};

// Per stage (M = batch x H x W pixels, C channels): fc1 and fc2 forward (x W^T), their input gradients
// (g W) and weight gradients (g^T x); then the stem's patchify convolution (4x4x3 -> C0) and the head.
std::vector<Gemm> shapes(bool tiny) {
  const int64_t batch = tiny ? 16 : 32, image = tiny ? 224 : 64;
  const std::vector<int64_t> dims =
      tiny ? std::vector<int64_t>{96, 192, 384, 768} : std::vector<int64_t>{40, 80, 160, 320};
  std::vector<Gemm> g;
  for (size_t s = 0; s < dims.size(); ++s) {
    const int64_t hw = image / 4 >> s, m = batch * hw * hw, c = dims[s];
    const std::string st = fmt::format("stage {} ", s);
    g.push_back({st + "fc1 fwd", false, true, m, 4 * c, c});
    g.push_back({st + "fc2 fwd", false, true, m, c, 4 * c});
    g.push_back({st + "fc1 dx", false, false, m, c, 4 * c});
    g.push_back({st + "fc2 dx", false, false, m, 4 * c, c});
    g.push_back({st + "fc1 dw", true, false, 4 * c, c, m});
    g.push_back({st + "fc2 dw", true, false, c, 4 * c, m});
  }
  const int64_t m0 = batch * (image / 4) * (image / 4);
  g.push_back({"stem fwd", false, true, m0, dims[0], 48});
  g.push_back({"stem dw", true, false, dims[0], 48, m0});
  g.push_back({"head fwd", false, true, batch, 1000, dims.back()});
  return g;
}

double seconds_per_call(const Gemm& g, const std::vector<float>& a, const std::vector<float>& b,
                        std::vector<float>& c, double budget) {
  const int64_t lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
  auto call = [&] {
    cpu::gemm<float>(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), g.n);
  };
  call();  // primitives, packing buffers
  using Clock = std::chrono::steady_clock;
  double best = 1e30;
  const auto start = Clock::now();
  for (int rep = 0; rep < 5 || std::chrono::duration<double>(Clock::now() - start).count() < budget; ++rep) {
    const auto t0 = Clock::now();
    call();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    if (rep > 1000) break;
  }
  return best;
}

int run(int argc, char** argv) {
  bool tiny = false;
  double budget = 0.3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tiny"))
      tiny = true;
    else if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc)
      budget = std::atof(argv[++i]);
    else
      return fmt::print(stderr, "usage: bench_gemm_bf16 [--tiny] [--seconds S]\n"), 2;
  }
  const cpu::CpuFeatures& f = cpu::cpu_features();
  cpu::require_bf16(f);
  fmt::print("CPU: {}; {} threads; bf16: {}; fp32: OpenBLAS (gemm<float>); best of >= {:.1f} s per cell\n",
             f.model, cpu_threads(), cpu::bf16_gemm_engine(), budget);
  fmt::print(
      "| GEMM | m x n x k | fp32 GFLOP/s | bf16 GFLOP/s | bf16 / fp32 |\n| --- | --- | --- | --- | --- |\n");
  double t32 = 0, t16 = 0;
  for (const Gemm& g : shapes(tiny)) {
    std::vector<float> a(size_t(g.m * g.k)), b(size_t(g.k * g.n)), c(size_t(g.m * g.n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7 % 13) - 6) / 8;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 5 % 11) - 5) / 8;
    double s32, s16;
    {
      cpu::ScopedMatmulPrecision p(cpu::MatmulPrecision::fp32);
      s32 = seconds_per_call(g, a, b, c, budget);
    }
    {
      cpu::ScopedMatmulPrecision p(cpu::MatmulPrecision::bf16);
      s16 = seconds_per_call(g, a, b, c, budget);
    }
    t32 += s32;
    t16 += s16;
    const double flop = 2.0 * double(g.m) * double(g.n) * double(g.k);
    fmt::print("| {} | {}x{}x{} | {:.1f} | {:.1f} | {:.2f}x |\n", g.name, g.m, g.n, g.k, flop / s32 / 1e9,
               flop / s16 / 1e9, s32 / s16);
  }
  fmt::print("| all of the above | | {:.2f} ms | {:.2f} ms | {:.2f}x |\n", 1e3 * t32, 1e3 * t16, t32 / t16);
  return 0;
}

}  // namespace
}  // namespace cz

int main(int argc, char** argv) {
  try {
    return cz::run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gemm_bf16: error: {}\n", e.what());
    return 1;
  }
}
