// The 8-bit crop + resize + flip (resample_u8) on each kernel of Note [Resize kernels per instruction set]
// (src/io/augment/resize_u8_kernels.h) against the scalar loops, for crops of ImageNet's median photograph
// (500x375) to 224 px as RandomResizedCrop cuts them; images/s of one thread. Kernels this CPU cannot run are
// skipped.
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "io/augment/image_transform.h"
#include "io/augment/resize_u8_kernels.h"

namespace cz {
namespace {

void BM_ResampleU8(benchmark::State& state) {
  const auto kernel = ResizeKernel(state.range(0));
  const auto interpolation = state.range(1) == 0 ? Interpolation::bilinear : Interpolation::bicubic;
  if (!resize_kernel_runs_here(kernel)) {
    state.SkipWithError("this CPU cannot run the kernel");
    return;
  }
  std::mt19937 gen(7);
  Image src{375, 500, std::vector<uint8_t>(375 * 500 * 3)};
  for (auto& v : src.pixels) v = uint8_t(gen());
  // A spread of crops: RandomResizedCrop's areas 8-100% of the image, flipped half the time.
  std::vector<CropBox> boxes;
  std::uniform_real_distribution<double> area(0.08, 1.0), ratio(0.75, 1.333);
  while (boxes.size() < 64) {
    const double a = area(gen) * 375 * 500, r = ratio(gen);
    const auto w = int64_t(std::sqrt(a * r)), h = int64_t(std::sqrt(a / r));
    if (w < 1 || h < 1 || w > 500 || h > 375) continue;
    boxes.push_back({int64_t(gen() % uint32_t(375 - h + 1)), int64_t(gen() % uint32_t(500 - w + 1)), h, w,
                     boxes.size() % 2 == 1});
  }
  Image out;
  size_t i = 0;
  for (auto _ : state) {
    resample_u8(src, boxes[i++ % boxes.size()], 224, interpolation, out, kernel);
    benchmark::DoNotOptimize(out.pixels.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(std::string(resize_kernel_name(kernel)) + " " + interpolation_name(interpolation));
}
BENCHMARK(BM_ResampleU8)->ArgsProduct({{0, 1, 2, 3}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace cz

BENCHMARK_MAIN();
