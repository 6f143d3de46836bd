// RandAugment's ops (src/io/augment/randaugment_*.cpp) one at a time on a 224x224 photograph-sized crop, at
// timm's magnitude 9 (rand-m9): microseconds per image of one thread, to see which ops are hot per pixel.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "io/augment/randaugment.h"

namespace cz {
namespace {

void BM_RaOp(benchmark::State& state) {
  const auto op = RaOp(state.range(0));
  std::mt19937 gen(3);
  Image src{224, 224, std::vector<uint8_t>(224 * 224 * 3)};
  // Smooth gradients with noise: a histogram and edges like a photograph's, not uniform noise.
  for (int64_t y = 0; y < 224; ++y)
    for (int64_t x = 0; x < 224; ++x)
      for (int64_t c = 0; c < 3; ++c)
        src.pixels[size_t((y * 224 + x) * 3 + c)] = uint8_t((x + 2 * y + 60 * c) / 3 + gen() % 16);
  const double arg = ra_op_argument(op, 9.0, false);
  Image img;
  for (auto _ : state) {
    img = src;
    apply_ra_op(op, arg, img, Interpolation::bilinear);
    benchmark::DoNotOptimize(img.pixels.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(ra_op_name(op));
}
BENCHMARK(BM_RaOp)->DenseRange(0, kRaOpCount - 1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace cz

BENCHMARK_MAIN();
