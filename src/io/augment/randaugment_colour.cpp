// RandAugment's colour ops with PIL's arithmetic (Note [PIL's arithmetic], randaugment_ops.h): lookup tables
// per channel, and the ImageEnhance blends with their degenerate images.
#include <algorithm>
#include <cstring>
#include <vector>

#include "io/augment/randaugment_ops.h"
#include "tensor/check.h"

namespace cz {
namespace {

using Lut = std::array<uint8_t, 256>;

// One table per channel, as PIL's Image.point with a 768-entry table.
void apply_luts(Image& img, const std::array<Lut, 3>& luts) {
  uint8_t* __restrict p = img.pixels.data();
  const int64_t n = img.height * img.width;
  for (int64_t i = 0; i < n; ++i, p += 3)
    for (int c = 0; c < 3; ++c) p[c] = luts[size_t(c)][p[c]];
}

void apply_lut(Image& img, const Lut& lut) {
  uint8_t* __restrict p = img.pixels.data();
  const size_t n = img.pixels.size();
  for (size_t i = 0; i < n; ++i) p[i] = lut[p[i]];
}

std::array<std::array<int64_t, 256>, 3> histograms(const Image& img) {
  std::array<std::array<int64_t, 256>, 3> h{};
  const uint8_t* p = img.pixels.data();
  const int64_t n = img.height * img.width;
  for (int64_t i = 0; i < n; ++i, p += 3)
    for (int c = 0; c < 3; ++c) ++h[size_t(c)][p[c]];
  return h;
}

Lut identity_lut() {
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[size_t(i)] = uint8_t(i);
  return lut;
}

// PIL's "L" conversion of one RGB pixel (ITU-R 601-2 luma in 16-bit fixed point).
uint8_t luma(const uint8_t* p) {
  return uint8_t((uint32_t(p[0]) * 19595 + uint32_t(p[1]) * 38470 + uint32_t(p[2]) * 7471 + 0x8000) >> 16);
}

// Note [Byte loops through raw pointers]: a store through `img.pixels[i]` is a uint8_t store, which may alias
// anything, the vector's own data pointer included, so the compiler reloads that pointer after every byte and
// vectorises nothing. The per-byte loops in this file (blend, the grey image, the SMOOTH filter, the tables)
// read and write through __restrict pointers taken once: the same operations in the same order on each byte,
// so the same bytes, 2-5x faster (bench/bench_randaugment.cpp; figures in docs/data.md).

// Image.blend(degenerate, img, factor), written into img. PIL takes the factor as a C float and computes in
// float; between 0 and 1 the result cannot leave [0, 255], outside it is clamped; both truncate.
void blend(Image& img, const std::vector<uint8_t>& degenerate, double factor) {
  const float alpha = float(factor);
  if (alpha == 0.0f) {
    img.pixels = degenerate;
    return;
  }
  if (alpha == 1.0f) return;
  // Raw restrict pointers (Note [Byte loops through raw pointers]).
  const uint8_t* __restrict deg = degenerate.data();
  uint8_t* __restrict p = img.pixels.data();
  const size_t n = img.pixels.size();
  for (size_t i = 0; i < n; ++i) {
    const int d = deg[i], v = p[i];
    const float t = float(d) + alpha * float(v - d);
    p[i] = t <= 0.0f ? uint8_t(0) : t >= 255.0f ? uint8_t(255) : uint8_t(t);
  }
}

// blend() against a degenerate image of one value `d` everywhere (Brightness: black; Contrast: the mean
// grey), without building that image: the same float expression per byte, with `d` a constant (vectorised).
void blend_constant(Image& img, uint8_t d, double factor) {
  const float alpha = float(factor);
  if (alpha == 1.0f) return;
  uint8_t* __restrict p = img.pixels.data();
  const size_t n = img.pixels.size();
  const float fd = float(d);
  for (size_t i = 0; i < n; ++i) {
    const float t = fd + alpha * float(int(p[i]) - int(d));
    p[i] = t <= 0.0f ? uint8_t(0) : t >= 255.0f ? uint8_t(255) : uint8_t(t);
  }
}

}  // namespace

void auto_contrast(Image& img) {
  const auto h = histograms(img);
  std::array<Lut, 3> luts;
  for (int c = 0; c < 3; ++c) {
    const auto& hc = h[size_t(c)];
    int lo = 0, hi = 255;
    while (lo < 255 && hc[size_t(lo)] == 0) ++lo;
    while (hi > 0 && hc[size_t(hi)] == 0) --hi;
    Lut& lut = luts[size_t(c)];
    if (hi <= lo) {
      lut = identity_lut();
      continue;
    }
    const double scale = 255.0 / double(hi - lo), offset = -double(lo) * scale;
    for (int i = 0; i < 256; ++i) {
      // Python's int() truncates toward zero.
      const int64_t v = int64_t(double(i) * scale + offset);
      lut[size_t(i)] = uint8_t(std::clamp<int64_t>(v, 0, 255));
    }
  }
  apply_luts(img, luts);
}

void equalize(Image& img) {
  const auto h = histograms(img);
  std::array<Lut, 3> luts;
  for (int c = 0; c < 3; ++c) {
    const auto& hc = h[size_t(c)];
    // PIL: step = (pixels - count of the highest level present) // 255; nothing to do with one level or a
    // zero step.
    int64_t total = 0, last = 0, levels = 0;
    for (int64_t v : hc)
      if (v) total += v, last = v, ++levels;
    const int64_t step = levels > 1 ? (total - last) / 255 : 0;
    Lut& lut = luts[size_t(c)];
    if (step == 0) {
      lut = identity_lut();
      continue;
    }
    int64_t n = step / 2;
    for (int i = 0; i < 256; ++i) {
      lut[size_t(i)] = uint8_t(std::min<int64_t>(n / step, 255));
      n += hc[size_t(i)];
    }
  }
  apply_luts(img, luts);
}

void invert(Image& img) {
  for (uint8_t& v : img.pixels) v = uint8_t(255 - v);
}

void posterize(Image& img, int bits) {
  CZ_CHECK(bits >= 0 && bits <= 8, "posterize: bits must be in [0, 8], got {}", bits);
  const unsigned mask = ~((1u << (8 - bits)) - 1) & 0xFFu;
  for (uint8_t& v : img.pixels) v = uint8_t(v & mask);
}

void solarize(Image& img, int threshold) {
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[size_t(i)] = uint8_t(i < threshold ? i : 255 - i);
  apply_lut(img, lut);
}

void solarize_add(Image& img, int add, int threshold) {
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[size_t(i)] = uint8_t(i < threshold ? std::min(255, i + add) : i);
  apply_lut(img, lut);
}

void color(Image& img, double factor) {
  std::vector<uint8_t> grey(img.pixels.size());
  const uint8_t* __restrict in = img.pixels.data();
  uint8_t* __restrict g = grey.data();
  for (size_t i = 0; i < grey.size(); i += 3) g[i] = g[i + 1] = g[i + 2] = luma(in + i);
  blend(img, grey, factor);
}

void contrast(Image& img, double factor) {
  // The degenerate image is the mean of the grey image, rounded (int(mean + 0.5)), in every channel.
  int64_t sum = 0;
  const int64_t n = img.height * img.width;
  for (int64_t i = 0; i < n; ++i) sum += luma(&img.pixels[size_t(i * 3)]);
  const double mean = n > 0 ? double(sum) / double(n) : 0.0;
  const uint8_t m = uint8_t(int64_t(mean + 0.5));
  blend_constant(img, m, factor);
}

void brightness(Image& img, double factor) {
  blend_constant(img, 0, factor);
}

void sharpness(Image& img, double factor) {
  // ImageFilter.SMOOTH: 1 1 1 / 1 5 1 / 1 1 1, divided by 13 as C floats. Images under 3x3 are left as
  // they are; otherwise the outermost rows and columns are copied.
  std::vector<uint8_t> smooth = img.pixels;
  const int64_t h = img.height, w = img.width;
  if (h >= 3 && w >= 3) {
    const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
    const uint8_t* in = img.pixels.data();
    const int64_t row = w * 3;
    for (int64_t y = 1; y < h - 1; ++y) {
      const uint8_t* up = in + (y - 1) * row;
      const uint8_t* mid = in + y * row;
      const uint8_t* down = in + (y + 1) * row;
      uint8_t* __restrict out = smooth.data() + y * row;
      // Values 3 .. row - 3 of the row (pixels 1 .. w - 2, every channel) in one flat loop the compiler can
      // vectorise (Note [Byte loops through raw pointers]).
      for (int64_t i = 3; i < row - 3; ++i) {
        // PIL adds the row below first, then this row, then the row above, each as a 1x3 dot product.
        float ss = 0.5f;
        ss += float(down[i - 3]) * k1 + float(down[i]) * k1 + float(down[i + 3]) * k1;
        ss += float(mid[i - 3]) * k1 + float(mid[i]) * k5 + float(mid[i + 3]) * k1;
        ss += float(up[i - 3]) * k1 + float(up[i]) * k1 + float(up[i + 3]) * k1;
        out[i] = ss <= 0.0f ? uint8_t(0) : ss >= 255.0f ? uint8_t(255) : uint8_t(ss);
      }
    }
  }
  blend(img, smooth, factor);
}

}  // namespace cz
