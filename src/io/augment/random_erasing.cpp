// Random erasing with timm's meanings (Note [Random erasing], random_erasing.h).
#include "io/augment/random_erasing.h"

#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "tensor/check.h"

namespace cz {
namespace {

constexpr double kMinArea = 0.02, kMaxArea = 1.0 / 3.0, kMinAspect = 0.3;

// Standard normal values two at a time (Box-Muller on 32-bit uniforms: plenty for f32 pixels).
class Normals {
 public:
  explicit Normals(CounterRng& rng) : rng_(rng) {}
  float next() {
    if (have_) {
      have_ = false;
      return spare_;
    }
    const double u1 = (double(rng_.next_u32()) + 1.0) * 0x1p-32;  // (0, 1]
    const double u2 = double(rng_.next_u32()) * 0x1p-32;
    const double r = std::sqrt(-2.0 * std::log(u1)), t = 2.0 * M_PI * u2;
    spare_ = float(r * std::sin(t));
    have_ = true;
    return float(r * std::cos(t));
  }

 private:
  CounterRng& rng_;
  float spare_ = 0;
  bool have_ = false;
};

}  // namespace

EraseMode parse_erase_mode(const std::string& name, const std::string& flag) {
  if (name == "const") return EraseMode::constant;
  if (name == "rand") return EraseMode::rand;
  if (name == "pixel") return EraseMode::pixel;
  throw ValueError(fmt::format("{} must be const, rand or pixel, got '{}'", flag, name));
}

std::vector<ErasePatch> draw_erasing(const RandomErasingConfig& cfg, int64_t height, int64_t width,
                                     CounterRng& rng) {
  std::vector<ErasePatch> patches;
  if (cfg.probability <= 0 || rng.uniform() > cfg.probability) return patches;  // timm: random() > p skips
  const int count = cfg.max_count <= 1 ? 1 : 1 + int(rng.below(cfg.max_count));
  const double area = double(height) * double(width);
  const double log_lo = std::log(kMinAspect), log_hi = std::log(1.0 / kMinAspect);
  Normals normal(rng);
  for (int b = 0; b < count; ++b) {
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target = rng.uniform(kMinArea, kMaxArea) * area / count;
      const double ratio = std::exp(rng.uniform(log_lo, log_hi));
      const int64_t h = int64_t(std::nearbyint(std::sqrt(target * ratio)));
      const int64_t w = int64_t(std::nearbyint(std::sqrt(target / ratio)));
      if (!(w < width && h < height)) continue;
      ErasePatch p;
      p.box = EraseBox{rng.below(height - h + 1), rng.below(width - w + 1), h, w};
      p.per_pixel = cfg.mode == EraseMode::pixel;
      p.values.assign(p.per_pixel ? size_t(h * w * 3) : 3, 0.0f);
      if (cfg.mode != EraseMode::constant)
        for (float& v : p.values) v = normal.next();
      patches.push_back(std::move(p));
      break;
    }
  }
  return patches;
}

void write_erasing(const std::vector<ErasePatch>& patches, float* img, int64_t width) {
  for (const ErasePatch& p : patches)
    for (int64_t y = p.box.top; y < p.box.top + p.box.h; ++y) {
      float* row = img + (y * width + p.box.left) * 3;
      for (int64_t i = 0; i < p.box.w * 3; ++i)
        row[i] = p.per_pixel ? p.values[size_t((y - p.box.top) * p.box.w * 3 + i)] : p.values[size_t(i % 3)];
    }
}

std::vector<EraseBox> random_erase(const RandomErasingConfig& cfg, float* img, int64_t height, int64_t width,
                                   CounterRng& rng) {
  const std::vector<ErasePatch> patches = draw_erasing(cfg, height, width, rng);
  write_erasing(patches, img, width);
  std::vector<EraseBox> boxes;
  for (const ErasePatch& p : patches) boxes.push_back(p.box);
  return boxes;
}

}  // namespace cz
