// Brightness and Contrast as tables (randaugment_colour.cpp's blend_constant) against PIL's Image.blend
// written out per value, as Note [PIL's arithmetic] (randaugment_ops.h) states it: factor as a C float,
// degenerate + factor * (image - degenerate) in float, clamped to [0, 255] and truncated. Random images and
// factors over and beyond timm's range (negative, above 2, exactly 0 and 1), so every table entry is checked
// against the formula, not only the fixture's magnitudes.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "io/augment/randaugment_ops.h"

namespace cz {
namespace {

uint8_t pil_blend(int d, int v, double factor) {
  const float alpha = float(factor);
  const float t = float(d) + alpha * float(v - d);
  return t <= 0.0f ? uint8_t(0) : t >= 255.0f ? uint8_t(255) : uint8_t(t);
}

uint8_t luma(const uint8_t* p) {
  return uint8_t((uint32_t(p[0]) * 19595 + uint32_t(p[1]) * 38470 + uint32_t(p[2]) * 7471 + 0x8000) >> 16);
}

std::vector<double> factors(std::mt19937& gen) {
  std::vector<double> f = {0.0, 1.0, 0.1, 1.9, -0.3, 2.7, 0.5, 1.5};
  std::uniform_real_distribution<double> u(-1.0, 3.0);
  for (int i = 0; i < 40; ++i) f.push_back(u(gen));
  return f;
}

Image random_image(std::mt19937& gen) {
  const int64_t h = 1 + gen() % 40, w = 1 + gen() % 40;
  Image img{h, w, std::vector<uint8_t>(size_t(h * w * 3))};
  for (auto& v : img.pixels) v = uint8_t(gen());
  return img;
}

TEST(RandAugmentBlend, BrightnessEqualsPilsBlendForEveryValue) {
  std::mt19937 gen(11);
  // All 256 values in one image, then random ones.
  Image ramp{1, 256, std::vector<uint8_t>(768)};
  for (int i = 0; i < 768; ++i) ramp.pixels[size_t(i)] = uint8_t(i / 3);
  for (double f : factors(gen)) {
    for (const Image& src : {ramp, random_image(gen)}) {
      Image img = src;
      brightness(img, f);
      for (size_t i = 0; i < img.pixels.size(); ++i)
        ASSERT_EQ(img.pixels[i], pil_blend(0, src.pixels[i], f))
            << "factor " << f << " value " << int(src.pixels[i]);
    }
  }
}

TEST(RandAugmentBlend, ContrastEqualsPilsBlendWithTheMeanGrey) {
  std::mt19937 gen(12);
  for (double f : factors(gen)) {
    const Image src = random_image(gen);
    int64_t sum = 0;
    const int64_t n = src.height * src.width;
    for (int64_t i = 0; i < n; ++i) sum += luma(&src.pixels[size_t(i * 3)]);
    const int m = int(int64_t(double(sum) / double(n) + 0.5));
    Image img = src;
    contrast(img, f);
    for (size_t i = 0; i < img.pixels.size(); ++i)
      ASSERT_EQ(img.pixels[i], pil_blend(m, src.pixels[i], f)) << "factor " << f << " mean " << m;
  }
}

}  // namespace
}  // namespace cz
