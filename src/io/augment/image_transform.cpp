// Random-resized-crop parameters and the separable crop/resize/flip/normalise pass.
#include "io/augment/image_transform.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "io/image/image.h"
#include "tensor/check.h"

namespace cz {

CropBox random_resized_crop(int64_t height, int64_t width, CounterRng& rng) {
  constexpr double kMinScale = 0.08, kMaxScale = 1.0;
  const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
  const double area = double(height) * double(width);
  CropBox box;
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target = area * rng.uniform(kMinScale, kMaxScale);
    const double ratio = std::exp(rng.uniform(log_lo, log_hi));
    const int64_t w = std::llround(std::sqrt(target * ratio));
    const int64_t h = std::llround(std::sqrt(target / ratio));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      box = {rng.below(height - h + 1), rng.below(width - w + 1), h, w};
      found = true;
    }
  }
  if (!found) {
    const double in_ratio = double(width) / double(height);
    int64_t w = width, h = height;
    if (in_ratio < 3.0 / 4.0)
      h = std::max<int64_t>(1, std::llround(double(w) / (3.0 / 4.0)));
    else if (in_ratio > 4.0 / 3.0)
      w = std::max<int64_t>(1, std::llround(double(h) * (4.0 / 3.0)));
    h = std::min(h, height);
    w = std::min(w, width);
    box = {(height - h) / 2, (width - w) / 2, h, w};
  }
  // Drawn even when a crop came from the fallback, so the stream's use is the same for every image.
  box.flip = rng.uniform() < 0.5;
  return box;
}

namespace {

// Filter taps of one output coordinate: source indices [first, first + weights.size()).
struct Taps {
  int64_t first = 0;
  std::vector<float> weights;
};

// The filter at x source pixels (already divided by the widening when shrinking).
double filter_weight(Interpolation interpolation, double x) {
  x = std::abs(x);
  if (interpolation == Interpolation::bilinear) return std::max(0.0, 1.0 - x);
  constexpr double a = -0.5;  // PIL's bicubic
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Taps mapping `out` outputs onto source pixels [start, start + len), mirrored when `flip`.
std::vector<Taps> axis_taps(int64_t start, int64_t len, int64_t out, bool flip, Interpolation interpolation) {
  const double scale = double(len) / double(out);
  const double widen = std::max(scale, 1.0);
  const double support = widen * (interpolation == Interpolation::bilinear ? 1.0 : 2.0);  // in source pixels
  std::vector<Taps> taps(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    const double center = (double(o) + 0.5) * scale;  // relative to `start`, in pixel-edge coordinates
    const int64_t lo = std::max<int64_t>(0, int64_t(std::floor(center - support)));
    const int64_t hi = std::min<int64_t>(len, int64_t(std::ceil(center + support)));
    Taps& t = taps[size_t(flip ? out - 1 - o : o)];
    t.first = start + lo;
    double sum = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const double wgt = filter_weight(interpolation, (double(i) + 0.5 - center) / widen);
      t.weights.push_back(float(wgt));
      sum += wgt;
    }
    // Clipping at the borders drops taps; renormalise. The tap nearest the centre has weight >= 1/2 for the
    // triangle and >= 0.56 for the cubic, so the sum is never near zero.
    for (float& wgt : t.weights) wgt = float(wgt / sum);
  }
  return taps;
}

}  // namespace

Interpolation parse_interpolation(const std::string& name, const std::string& flag) {
  if (name == "bilinear") return Interpolation::bilinear;
  if (name == "bicubic") return Interpolation::bicubic;
  throw ValueError(fmt::format("{} must be bilinear or bicubic, got '{}'", flag, name));
}

const char* interpolation_name(Interpolation interpolation) {
  return interpolation == Interpolation::bicubic ? "bicubic" : "bilinear";
}

void resample_normalised(const Image& src, const CropBox& box, int64_t size, float* out,
                         Interpolation interpolation) {
  const std::vector<Taps> xs = axis_taps(box.x, box.w, size, box.flip, interpolation);
  const std::vector<Taps> ys = axis_taps(box.y, box.h, size, false, interpolation);
  // Horizontal pass over the crop's rows into floats, then the vertical pass per output row.
  std::vector<float> rows(size_t(box.h * size * 3));
  for (int64_t y = 0; y < box.h; ++y) {
    const uint8_t* in = src.pixels.data() + (box.y + y) * src.width * 3;
    float* r = rows.data() + y * size * 3;
    for (int64_t o = 0; o < size; ++o) {
      const Taps& t = xs[size_t(o)];
      float acc[3] = {0, 0, 0};
      for (size_t k = 0; k < t.weights.size(); ++k) {
        const uint8_t* p = in + (t.first + int64_t(k)) * 3;
        for (int c = 0; c < 3; ++c) acc[c] += t.weights[k] * float(p[c]);
      }
      for (int c = 0; c < 3; ++c) r[o * 3 + c] = acc[c];
    }
  }
  float mul[3], add[3];  // (v / 255 - mean) / std as one multiply-add
  for (int c = 0; c < 3; ++c) {
    mul[c] = 1.0f / (255.0f * kImageNetStd[c]);
    add[c] = -kImageNetMean[c] / kImageNetStd[c];
  }
  const int64_t row_len = size * 3;
  for (int64_t o = 0; o < size; ++o) {
    const Taps& t = ys[size_t(o)];
    float* dst = out + o * row_len;
    std::fill(dst, dst + row_len, 0.0f);
    for (size_t k = 0; k < t.weights.size(); ++k) {
      const float* r = rows.data() + (t.first - box.y + int64_t(k)) * row_len;
      const float wgt = t.weights[k];
      for (int64_t i = 0; i < row_len; ++i) dst[i] += wgt * r[i];
    }
    for (int64_t i = 0; i < row_len; ++i) dst[i] = dst[i] * mul[i % 3] + add[i % 3];
  }
}

}  // namespace cz
