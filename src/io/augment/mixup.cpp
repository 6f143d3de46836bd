// Mixup and CutMix (Note [Mixing within a micro-batch], mixup.h): the draws, the pixels and the targets.
#include "io/augment/mixup.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/image/counter_rng.h"
#include "tensor/check.h"

namespace cz {
namespace {

// (0, 1]: safe for log.
double open_uniform(CounterRng& rng) {
  return 1.0 - rng.uniform();
}

double standard_normal(CounterRng& rng) {
  // Box-Muller, one value per pair of uniforms.
  return std::sqrt(-2.0 * std::log(open_uniform(rng))) * std::cos(2.0 * M_PI * rng.uniform());
}

// Gamma(a, 1) by Marsaglia and Tsang's squeeze method; a < 1 through Gamma(a + 1) * U^(1/a).
double gamma_draw(double a, CounterRng& rng) {
  if (a < 1) return gamma_draw(a + 1, rng) * std::pow(open_uniform(rng), 1.0 / a);
  const double d = a - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = standard_normal(rng);
    double v = 1.0 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = open_uniform(rng);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

// Beta(a, a) = X / (X + Y) with X, Y ~ Gamma(a), as numpy's beta for small a; redrawn in the (tiny a) case
// where both underflow.
double beta_draw(double a, CounterRng& rng) {
  for (;;) {
    const double x = gamma_draw(a, rng), y = gamma_draw(a, rng);
    if (x + y > 0) return x / (x + y);
  }
}

// numpy's randint(lo, hi): uniform in [lo, hi), lo < hi.
int64_t randint(int64_t lo, int64_t hi, CounterRng& rng) {
  return lo + rng.below(hi - lo);
}

// timm's cutmix_bbox_and_lam for one image: the box and lam corrected to the box's area (correct_lam, timm's
// default, and always with minmax). rand_bbox: a square-ish box of side sqrt(1 - lam) of each dimension
// centred at a uniform pixel, clipped; rand_bbox_minmax: sides uniform in [H lo, H hi), placed inside.
MixBox cutmix_box(const MixConfig& c, double& lam, int64_t h, int64_t w, CounterRng& rng) {
  MixBox b;
  if (c.cutmix_minmax) {
    const auto [lo, hi] = *c.cutmix_minmax;
    const int64_t ch = randint(int64_t(double(h) * lo), int64_t(double(h) * hi), rng);
    const int64_t cw = randint(int64_t(double(w) * lo), int64_t(double(w) * hi), rng);
    b.y0 = randint(0, h - ch + 1, rng);
    b.x0 = randint(0, w - cw + 1, rng);
    b.y1 = b.y0 + ch;
    b.x1 = b.x0 + cw;
  } else {
    const double ratio = std::sqrt(1.0 - lam);
    const int64_t ch = int64_t(double(h) * ratio), cw = int64_t(double(w) * ratio);
    const int64_t cy = randint(0, h, rng), cx = randint(0, w, rng);
    b.y0 = std::clamp<int64_t>(cy - ch / 2, 0, h);
    b.y1 = std::clamp<int64_t>(cy + (ch + 1) / 2, 0, h);
    b.x0 = std::clamp<int64_t>(cx - cw / 2, 0, w);
    b.x1 = std::clamp<int64_t>(cx + (cw + 1) / 2, 0, w);
  }
  lam = 1.0 - double(b.area()) / double(h * w);
  return b;
}

// One draw of timm's _params_per_batch / one element of _params_per_elem: (lam, use CutMix).
std::pair<double, bool> draw_lam(const MixConfig& c, CounterRng& rng) {
  if (rng.uniform() >= c.prob) return {1.0, false};
  const double cutmix_alpha = c.cutmix_minmax ? 1.0 : c.cutmix_alpha;  // timm forces 1 with minmax
  if (c.mixup_alpha > 0 && cutmix_alpha > 0) {
    const bool cut = rng.uniform() < c.switch_prob;
    return {beta_draw(cut ? cutmix_alpha : c.mixup_alpha, rng), cut};
  }
  if (c.mixup_alpha > 0) return {beta_draw(c.mixup_alpha, rng), false};
  return {beta_draw(cutmix_alpha, rng), true};
}

// The two weights timm multiplies by: f32(lam) and f32(1 - lam), the subtraction in f64 in batch mode (lam a
// Python float) and in f32 in pair and elem modes (lam a float32 array there).
}  // namespace

MixMode parse_mix_mode(const std::string& s) {
  if (s == "batch") return MixMode::batch;
  if (s == "pair") return MixMode::pair;
  CZ_CHECK(s == "elem", "mixing mode must be batch, pair or elem, got '{}'", s);
  return MixMode::elem;
}

const char* mix_mode_name(MixMode m) {
  return m == MixMode::batch ? "batch" : m == MixMode::pair ? "pair" : "elem";
}

std::pair<double, double> parse_cutmix_minmax(const std::string& s, const std::string& flag) {
  const size_t comma = s.find(',');
  double lo = NAN, hi = NAN;
  size_t used_lo = 0, used_hi = 0;
  try {
    if (comma != std::string::npos) {
      lo = std::stod(s.substr(0, comma), &used_lo);
      hi = std::stod(s.substr(comma + 1), &used_hi);
    }
  } catch (const std::exception&) {
    lo = NAN;
  }
  const bool parsed = comma != std::string::npos && used_lo == comma && used_hi == s.size() - comma - 1;
  CZ_CHECK(parsed && lo >= 0 && lo < hi && hi <= 1,
           "{} must be LO,HI with 0 <= LO < HI <= 1 (CutMix box sides as fractions of the image's), got '{}'",
           flag, s);
  return {lo, hi};
}

void check_mix_config(const MixConfig& c, int64_t image_size) {
  CZ_CHECK(c.mixup_alpha >= 0 && c.cutmix_alpha >= 0, "Mixup/CutMix: alphas must be >= 0, got {} and {}",
           c.mixup_alpha, c.cutmix_alpha);
  CZ_CHECK(c.prob >= 0 && c.prob <= 1 && c.switch_prob >= 0 && c.switch_prob <= 1,
           "Mixup/CutMix: probabilities must be in [0, 1], got {} and {}", c.prob, c.switch_prob);
  CZ_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 1,
           "Mixup/CutMix: smoothing must be in [0, 1), got {}", c.label_smoothing);
  if (c.cutmix_minmax) {
    const auto [lo, hi] = *c.cutmix_minmax;
    const int64_t a = int64_t(double(image_size) * lo), b = int64_t(double(image_size) * hi);
    CZ_CHECK(a < b, "CutMix box sides in [{}, {}) of {} pixels: the range [{}, {}) holds no whole pixel", lo,
             hi, image_size, a, b);
  }
}

CounterRng mix_stream(uint64_t seed, int64_t epoch, int64_t first_position) {
  // 2^20 blocks (4 Mi draws) per micro-batch: far more than elem mode's few per image needs.
  return CounterRng(rng_key(rng_key(seed, RngDomain::mix) + uint64_t(epoch), RngDomain::mix),
                    uint64_t(first_position) << 20);
}

MixParams draw_mix(const MixConfig& c, int64_t n, int64_t height, int64_t width, CounterRng& rng) {
  CZ_CHECK(c.active(), "draw_mix: neither Mixup nor CutMix is on");
  CZ_CHECK(n % 2 == 0, "Mixup/CutMix pairs image i with image n-1-i and needs an even batch, got {}", n);
  MixParams p;
  p.mode = c.mode;
  p.samples.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) p.samples[size_t(i)].partner = n - 1 - i;
  if (c.mode == MixMode::batch) {
    auto [lam, cut] = draw_lam(c, rng);
    MixBox box;
    if (lam != 1.0 && cut) box = cutmix_box(c, lam, height, width, rng);
    for (SampleMix& s : p.samples) {
      s.lam = lam;
      s.cutmix = cut && lam != 1.0;
      s.box = box;
    }
    return p;
  }
  // pair: draws for the first half, each shared with its partner; elem: a draw per image.
  const int64_t draws = c.mode == MixMode::pair ? n / 2 : n;
  for (int64_t i = 0; i < draws; ++i) {
    auto [lam, cut] = draw_lam(c, rng);
    SampleMix& s = p.samples[size_t(i)];
    s.lam = double(float(lam));  // timm's lam array is float32
    if (s.lam != 1.0 && cut) {
      double corrected = s.lam;
      s.box = cutmix_box(c, corrected, height, width, rng);
      s.lam = double(float(corrected));
      s.cutmix = true;
    }
    if (c.mode == MixMode::pair) {
      SampleMix& t = p.samples[size_t(n - 1 - i)];
      t.lam = s.lam;
      t.cutmix = s.cutmix;
      t.box = s.box;
    }
  }
  return p;
}

namespace {

// Image `dst` made from its unmixed pixels `mine` and its partner's `theirs` (both copies) as `s` says.
void mix_one(const SampleMix& s, MixMode mode, const float* mine, const float* theirs, float* dst, int64_t w,
             int64_t ch, int64_t pixels) {
  if (s.cutmix) {
    for (int64_t y = s.box.y0; y < s.box.y1; ++y)
      std::memcpy(dst + (y * w + s.box.x0) * ch, theirs + (y * w + s.box.x0) * ch,
                  size_t((s.box.x1 - s.box.x0) * ch) * sizeof(float));
  } else if (s.lam != 1.0) {
    const auto [l, m] = mix_weights(mode, s.lam);
    for (int64_t k = 0; k < pixels; ++k) {
      // Two roundings and a sum, as timm's mul_, mul_ and add_ (this file is compiled with
      // -ffp-contract=off: no fused multiply-add).
      const float a = mine[k] * l, b = theirs[k] * m;
      dst[k] = a + b;
    }
  }
}

}  // namespace

std::pair<float, float> mix_weights(MixMode mode, double lam) {
  if (mode == MixMode::batch) return {float(lam), float(1.0 - lam)};
  const float l = float(lam);
  return {l, 1.0f - l};
}

void apply_mix(const MixParams& p, Tensor& images) {
  CZ_CHECK(
      images.is_cpu() && images.dtype() == DType::f32 && images.is_contiguous() && images.dim() == 4 &&
          images.size(0) == int64_t(p.samples.size()) && images.size(0) % 2 == 0,
      "apply_mix: images must be a contiguous CPU f32 (n, H, W, C) tensor of the {} mixed images, got {} {}",
      p.samples.size(), dtype_name(images.dtype()), shape_str(images.sizes()));
  const int64_t n = images.size(0), w = images.size(2), ch = images.size(3);
  const int64_t pixels = images.size(1) * w * ch;
  for (int64_t i = 0; i < n; ++i)
    CZ_CHECK(p.samples[size_t(i)].partner == n - 1 - i,
             "apply_mix: image {} is paired with {}; timm's pairing (n-1-i) is the one supported", i,
             p.samples[size_t(i)].partner);
  // Each pair (i, n-1-i) is made from copies of its own two images: no copy of the whole batch (whose fresh
  // pages cost more than the mixing itself), and the scratch is reused by the loader's thread.
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(2 * pixels));
  float* out = n > 0 ? images.data<float>() : nullptr;
  for (int64_t i = 0; i < n / 2; ++i) {
    const int64_t j = n - 1 - i;
    float *a = scratch.data(), *b = scratch.data() + pixels;
    std::memcpy(a, out + i * pixels, size_t(pixels) * sizeof(float));
    std::memcpy(b, out + j * pixels, size_t(pixels) * sizeof(float));
    mix_one(p.samples[size_t(i)], p.mode, a, b, out + i * pixels, w, ch, pixels);
    mix_one(p.samples[size_t(j)], p.mode, b, a, out + j * pixels, w, ch, pixels);
  }
}

Tensor mix_targets(const MixParams& p, const Tensor& labels, int64_t num_classes, double smoothing) {
  const int64_t n = int64_t(p.samples.size());
  CZ_CHECK(labels.is_cpu() && labels.dtype() == DType::i64 && labels.is_contiguous() && labels.numel() == n,
           "mix_targets: labels must be {} contiguous CPU i64 values, got {} {}", n,
           dtype_name(labels.dtype()), shape_str(labels.sizes()));
  const int64_t* y = n > 0 ? labels.data<int64_t>() : nullptr;
  const double off64 = smoothing / double(num_classes);
  const float off = float(off64), on = float(1.0 - smoothing + off64);
  Tensor t = empty({n, num_classes}, DType::f32);
  float* pt = n > 0 ? t.data<float>() : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const SampleMix& s = p.samples[size_t(i)];
    const int64_t a = y[i], b = y[s.partner];
    CZ_CHECK(a >= 0 && a < num_classes && b >= 0 && b < num_classes,
             "mix_targets: label {} or {} is out of range for {} classes", a, b, num_classes);
    const auto [l, m] = mix_weights(p.mode, s.lam);
    for (int64_t k = 0; k < num_classes; ++k) {
      const float y1 = k == a ? on : off, y2 = k == b ? on : off;
      const float u = y1 * l, v = y2 * m;
      pt[i * num_classes + k] = u + v;
    }
  }
  return t;
}

}  // namespace cz
