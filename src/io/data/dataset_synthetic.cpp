// The embedded synthetic source: class-dependent coloured gratings with per-sample jitter and noise, drawn on
// the fly from (seed, split, index), so it needs no files and every rank and thread sees the same pixels.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <vector>

#include "io/data/dataset_sources.h"
#include "io/data/sampler.h"
#include "tensor/check.h"

namespace cz {
namespace {

struct SyntheticOptions {
  int64_t n = 4096, eval_n = 512, classes = 10, size = 64;
  uint64_t seed = 0;
};

// Each sample owns 2^22 Philox blocks (a 1024x1024 image's noise needs 786432); the top bits name the split.
constexpr int64_t kMaxSize = 1024;
constexpr int kSampleShift = 22;
constexpr int64_t kMaxSamples = int64_t(1) << 36;  // the loader's augmentation counters allow 2^36 positions

int64_t parse_int(const std::string& what, const std::string& key, const std::string& value, int64_t lo,
                  int64_t hi) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  CZ_CHECK(ec == std::errc() && end == value.data() + value.size() && v >= lo && v <= hi,
           "{}: synthetic option {}={} must be an integer in [{}, {}]", what, key, value, lo, hi);
  return v;
}

SyntheticOptions parse_options(const std::string& what, const std::string& text, int64_t default_size) {
  SyntheticOptions o;
  o.size = default_size;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = item.find('=');
    CZ_CHECK(eq != std::string::npos, "{}: synthetic option '{}' is not key=value", what, item);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "n")
      o.n = parse_int(what, key, value, 1, kMaxSamples);
    else if (key == "eval_n")
      o.eval_n = parse_int(what, key, value, 1, kMaxSamples);
    else if (key == "classes")
      o.classes = parse_int(what, key, value, 2, 1000);
    else if (key == "size")
      o.size = parse_int(what, key, value, 8, kMaxSize);
    else if (key == "seed")
      o.seed = uint64_t(parse_int(what, key, value, 0, INT64_MAX));
    else
      throw ValueError(fmt::format(
          "{}: unknown synthetic option '{}' (known: n, eval_n, classes, size, seed)", what, key));
  }
  CZ_CHECK(o.size >= 8 && o.size <= kMaxSize, "{}: synthetic image size {} must be in [8, {}]", what, o.size,
           kMaxSize);
  return o;
}

// What makes a class: a hue (neighbouring classes have neighbouring hues, so colour alone is ambiguous), a
// grating orientation and a spatial frequency spread by irrational steps so that classes close in hue are far
// apart in orientation.
struct ClassLook {
  float colour[3];
  double angle, cycles;
};

ClassLook class_look(int64_t c, int64_t classes) {
  ClassLook k;
  const double hue = 2 * std::numbers::pi * double(c) / double(classes);
  for (int ch = 0; ch < 3; ++ch) k.colour[ch] = float(std::cos(hue - 2 * std::numbers::pi * ch / 3));
  const double golden = 0.6180339887498949, plastic = 0.7548776662466927;
  k.angle = std::numbers::pi * std::fmod(double(c) * golden, 1.0);
  k.cycles = 2.0 + 3.0 * std::fmod(double(c) * plastic, 1.0);
  return k;
}

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(SyntheticOptions o, Split split)
      : o_(o), split_(split), key_(rng_key(o.seed, RngDomain::synthetic)) {}

  int64_t size() const override { return split_ == Split::train ? o_.n : o_.eval_n; }
  int64_t num_classes() const override { return o_.classes; }
  int64_t label(int64_t index) const override { return index % o_.classes; }
  std::string describe() const override {
    return fmt::format(
        "synthetic:n={},eval_n={},classes={},size={},seed={} ({}, {} images {}x{}, {} classes)", o_.n,
        o_.eval_n, o_.classes, o_.size, o_.seed, split_name(split_), size(), o_.size, o_.size, o_.classes);
  }

  void read(int64_t index, Image& out) const override {
    CZ_CHECK(index >= 0 && index < size(), "synthetic: index {} out of range [0, {})", index, size());
    const ClassLook look = class_look(label(index), o_.classes);
    // Train and eval samples come from disjoint block ranges: the eval split is unseen data.
    const uint64_t tag = split_ == Split::train ? 1 : 2;
    CounterRng rng(key_, tag << 62 | uint64_t(index) << kSampleShift);
    const double s = double(o_.size);
    const double angle = look.angle + rng.uniform(-0.12, 0.12) * std::numbers::pi;
    const double freq = 2 * std::numbers::pi * look.cycles * rng.uniform(0.85, 1.15) / s;
    const double phase = rng.uniform(0, 2 * std::numbers::pi);
    const double contrast = rng.uniform(35, 70);
    const double brightness = rng.uniform(-30, 30);
    double tint[3];
    for (double& t : tint) t = rng.uniform(-25, 25);
    // A Gaussian envelope at a random place shifts where the pattern shows.
    const double cy = s * rng.uniform(0.3, 0.7), cx = s * rng.uniform(0.3, 0.7);
    const double sigma = s * rng.uniform(0.25, 0.45);
    const double fx = freq * std::cos(angle), fy = freq * std::sin(angle);

    out.height = out.width = o_.size;
    out.pixels.resize(size_t(o_.size * o_.size * 3));
    // The envelope exp(-(dx^2 + dy^2) / (2 sigma^2)) is the product of a column's factor and a row's, and the
    // grating's cos(fx dx + fy dy + phase) is cos a cos b - sin a sin b with a = fx dx, b = fy dy + phase:
    // exp, cos and sin per column and per row only, not per pixel. A loader thread made 1.5x as many 64-px
    // images a second from that, 2.4x with the rounding below (6900 -> 16700).
    const size_t n = static_cast<size_t>(o_.size);
    std::vector<double> env_x(n), cos_x(n), sin_x(n);
    const double inv_two_var = 1 / (2 * sigma * sigma);
    for (size_t x = 0; x < n; ++x) {
      const double dx = double(x) - cx;
      env_x[x] = std::exp(-dx * dx * inv_two_var);
      cos_x[x] = std::cos(fx * dx);
      sin_x[x] = std::sin(fx * dx);
    }
    double base[3], gain[3];
    for (int ch = 0; ch < 3; ++ch) {
      base[ch] = 128 + brightness + 40 * look.colour[ch] + tint[ch];
      gain[ch] = 1 + 0.35 * look.colour[ch];
    }
    constexpr double kNoiseScale = 24.0 / 65535.0;
    uint8_t* px = out.pixels.data();
    for (size_t y = 0; y < n; ++y) {
      const double dy = double(y) - cy;
      const double row = contrast * std::exp(-dy * dy * inv_two_var);
      const double cos_y = std::cos(fy * dy + phase), sin_y = std::sin(fy * dy + phase);
      for (size_t x = 0; x < n; ++x) {
        const double wave = row * env_x[x] * (cos_x[x] * cos_y - sin_x[x] * sin_y);
        for (int ch = 0; ch < 3; ++ch) {
          // Triangular noise in (-24, 24) from two 16-bit halves of one draw.
          const uint32_t r = rng.next_u32();
          const double noise = kNoiseScale * double((r & 0xFFFF) + (r >> 16)) - 24.0;
          const double v = base[ch] + wave * gain[ch] + noise;
          *px++ = uint8_t(std::clamp(v, 0.0, 255.0) + 0.5);  // rounded to nearest (a libm call was 15%)
        }
      }
    }
  }

 private:
  SyntheticOptions o_;
  Split split_;
  uint64_t key_;
};

}  // namespace

std::shared_ptr<const Dataset> open_synthetic(const std::string& what, const std::string& options,
                                              Split split, const DatasetOptions& dataset_options) {
  return std::make_shared<SyntheticDataset>(parse_options(what, options, dataset_options.image_size), split);
}

}  // namespace cz
