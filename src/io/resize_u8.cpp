// The 8-bit crop + resize + flip of Note [8-bit resize] (image_transform.h), with PIL's arithmetic, and the
// normalisation of an 8-bit image. Compiled with -ffp-contract=off, like the RandAugment ops: the fixed-point
// coefficients come from doubles rounded at each step as PIL's C does.
#include <algorithm>
#include <vector>

#include "io/image_transform.h"
#include "io/loader.h"

namespace cz {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's: 8 bits of result, 2 for overshoot and sign

double pil_filter(Interpolation interpolation, double x) {
  if (x < 0.0) x = -x;
  if (interpolation == Interpolation::bilinear) return x < 1.0 ? 1.0 - x : 0.0;
  constexpr double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One output coordinate's taps: source pixels [first, first + k.size()) of the cropped axis.
struct FixedTaps {
  int64_t first = 0;
  std::vector<int32_t> k;
};

// PIL's precompute_coeffs + normalize_coeffs_8bpc for an axis of `in` pixels resized to `out` (the crop is
// the whole input, as torchvision crops before resizing).
std::vector<FixedTaps> fixed_taps(int64_t in, int64_t out, Interpolation interpolation) {
  const double scale = double(in) / double(out);
  const double filterscale = std::max(scale, 1.0);
  const double support = (interpolation == Interpolation::bilinear ? 1.0 : 2.0) * filterscale;
  const double inv_filterscale = 1.0 / filterscale;
  std::vector<FixedTaps> taps(static_cast<size_t>(out));
  std::vector<double> w;
  for (int64_t xx = 0; xx < out; ++xx) {
    const double center = (double(xx) + 0.5) * scale;
    const int64_t xmin = std::max<int64_t>(0, int64_t(center - support + 0.5));
    const int64_t xmax = std::min<int64_t>(in, int64_t(center + support + 0.5)) - xmin;
    w.assign(size_t(std::max<int64_t>(xmax, 0)), 0.0);
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      w[size_t(x)] = pil_filter(interpolation, (double(x + xmin) - center + 0.5) * inv_filterscale);
      ww += w[size_t(x)];
    }
    FixedTaps& t = taps[size_t(xx)];
    t.first = xmin;
    for (double v : w) {
      if (ww != 0.0) v /= ww;
      t.k.push_back(v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits))
                          : int32_t(0.5 + v * (1 << kPrecisionBits)));
    }
  }
  return taps;
}

uint8_t clip8(int32_t ss) {
  return uint8_t(std::clamp<int32_t>(ss >> kPrecisionBits, 0, 255));  // arithmetic shift: floor
}

// PIL sums in 32-bit ints: 8-bit values times coefficients of 22 bits whose absolute values add up to at
// most about 1.14 (the bicubic's negative lobes) stay below 2^31, and integer sums are exact in any order,
// so the loops below may run over the taps in whatever order is fastest.

// One horizontal pass: `rows` rows of `in` (pixels `stride` bytes apart row to row) resampled by `taps` into
// `out`, taps.size() pixels per row, rounded to 8 bits.
void horizontal_pass(const uint8_t* in, int64_t stride, int64_t rows, const std::vector<FixedTaps>& taps,
                     uint8_t* out) {
  const int64_t width = int64_t(taps.size());
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* r = in + y * stride;
    uint8_t* o = out + y * width * 3;
    for (int64_t xx = 0; xx < width; ++xx) {
      const FixedTaps& t = taps[size_t(xx)];
      const uint8_t* p = r + t.first * 3;
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (const int32_t k : t.k) {
        s0 += int32_t(p[0]) * k, s1 += int32_t(p[1]) * k, s2 += int32_t(p[2]) * k;
        p += 3;
      }
      o[xx * 3] = clip8(s0), o[xx * 3 + 1] = clip8(s1), o[xx * 3 + 2] = clip8(s2);
    }
  }
}

// One vertical pass: `width` pixels of each of taps.size() output rows from the rows of `in` (`stride` bytes
// apart), rounded to 8 bits; whole rows at a time, accumulated in `acc`.
void vertical_pass(const uint8_t* in, int64_t stride, int64_t width, const std::vector<FixedTaps>& taps,
                   uint8_t* out) {
  const int64_t n = width * 3;
  std::vector<int32_t> acc(static_cast<size_t>(n));
  for (size_t yy = 0; yy < taps.size(); ++yy) {
    const FixedTaps& t = taps[yy];
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    for (size_t y = 0; y < t.k.size(); ++y) {
      const uint8_t* r = in + (t.first + int64_t(y)) * stride;
      const int32_t k = t.k[y];
      for (int64_t i = 0; i < n; ++i) acc[size_t(i)] += int32_t(r[i]) * k;
    }
    uint8_t* o = out + int64_t(yy) * n;
    for (int64_t i = 0; i < n; ++i) o[i] = clip8(acc[size_t(i)]);
  }
}

}  // namespace

void resample_u8(const Image& src, const CropBox& box, int64_t size, Interpolation interpolation,
                 Image& out) {
  out.height = out.width = size;
  out.pixels.resize(size_t(size * size * 3));
  const int64_t stride = src.width * 3;
  const uint8_t* crop = src.pixels.data() + box.y * stride + box.x * 3;
  const bool horizontal = box.w != size, vertical = box.h != size;  // PIL skips a pass that changes nothing
  // Pillow 13 runs the vertical pass first when the height shrinks by more than twice what the width does
  // (fewer rows for the horizontal pass); earlier versions always went horizontal first. The two orders
  // round differently in between, so the order is part of matching it.
  const bool vertical_first = box.h - size > 0 && box.h - size > (box.w - size) * 2;
  std::vector<uint8_t> tmp;
  if (horizontal && vertical) {
    const std::vector<FixedTaps> xs = fixed_taps(box.w, size, interpolation);
    const std::vector<FixedTaps> ys = fixed_taps(box.h, size, interpolation);
    if (vertical_first) {
      tmp.resize(size_t(size * box.w * 3));
      vertical_pass(crop, stride, box.w, ys, tmp.data());
      horizontal_pass(tmp.data(), box.w * 3, size, xs, out.pixels.data());
    } else {
      tmp.resize(size_t(box.h * size * 3));
      horizontal_pass(crop, stride, box.h, xs, tmp.data());
      vertical_pass(tmp.data(), size * 3, size, ys, out.pixels.data());
    }
  } else if (horizontal) {
    horizontal_pass(crop, stride, size, fixed_taps(box.w, size, interpolation), out.pixels.data());
  } else if (vertical) {
    vertical_pass(crop, stride, size, fixed_taps(box.h, size, interpolation), out.pixels.data());
  } else {
    for (int64_t y = 0; y < size; ++y)
      std::copy_n(crop + y * stride, size * 3, out.pixels.data() + y * size * 3);
  }
  if (box.flip) {
    for (int64_t y = 0; y < size; ++y) {
      uint8_t* r = out.pixels.data() + y * size * 3;
      for (int64_t a = 0, b = size - 1; a < b; ++a, --b)
        for (int c = 0; c < 3; ++c) std::swap(r[a * 3 + c], r[b * 3 + c]);
    }
  }
}

void normalise_u8(const Image& img, float* out) {
  float mul[3], add[3];  // the multiply-add of resample_normalised
  for (int c = 0; c < 3; ++c) {
    mul[c] = 1.0f / (255.0f * kImageNetStd[c]);
    add[c] = -kImageNetMean[c] / kImageNetStd[c];
  }
  const int64_t n = img.height * img.width * 3;
  for (int64_t i = 0; i < n; ++i) out[i] = float(img.pixels[size_t(i)]) * mul[i % 3] + add[i % 3];
}

}  // namespace cz
