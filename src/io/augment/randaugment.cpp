// RandAugment's config grammar, op sets, level functions and per-image draws (Note [RandAugment],
// randaugment.h).
#include "io/augment/randaugment.h"

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "io/image/image.h"
#include "tensor/check.h"

namespace cz {
namespace {

constexpr std::array<const char*, kRaOpCount> kNames = {"AutoContrast",
                                                        "Equalize",
                                                        "Invert",
                                                        "Rotate",
                                                        "Posterize",
                                                        "PosterizeIncreasing",
                                                        "Solarize",
                                                        "SolarizeIncreasing",
                                                        "SolarizeAdd",
                                                        "Color",
                                                        "ColorIncreasing",
                                                        "Contrast",
                                                        "ContrastIncreasing",
                                                        "Brightness",
                                                        "BrightnessIncreasing",
                                                        "Sharpness",
                                                        "SharpnessIncreasing",
                                                        "ShearX",
                                                        "ShearY",
                                                        "TranslateXRel",
                                                        "TranslateYRel"};

// timm's _RAND_TRANSFORMS and _RAND_INCREASING_TRANSFORMS, in its order.
const std::vector<RaOp> kDefaultSet = {
    RaOp::AutoContrast, RaOp::Equalize,    RaOp::Invert, RaOp::Rotate,        RaOp::Posterize,
    RaOp::Solarize,     RaOp::SolarizeAdd, RaOp::Color,  RaOp::Contrast,      RaOp::Brightness,
    RaOp::Sharpness,    RaOp::ShearX,      RaOp::ShearY, RaOp::TranslateXRel, RaOp::TranslateYRel};
const std::vector<RaOp> kIncreasingSet = {RaOp::AutoContrast,
                                          RaOp::Equalize,
                                          RaOp::Invert,
                                          RaOp::Rotate,
                                          RaOp::PosterizeIncreasing,
                                          RaOp::SolarizeIncreasing,
                                          RaOp::SolarizeAdd,
                                          RaOp::ColorIncreasing,
                                          RaOp::ContrastIncreasing,
                                          RaOp::BrightnessIncreasing,
                                          RaOp::SharpnessIncreasing,
                                          RaOp::ShearX,
                                          RaOp::ShearY,
                                          RaOp::TranslateXRel,
                                          RaOp::TranslateYRel};
// timm's _RAND_WEIGHTED_0 (`tweights`), in its order, with its weights.
const std::vector<RaOp> kWeightedSet = {RaOp::Rotate,
                                        RaOp::ShearX,
                                        RaOp::ShearY,
                                        RaOp::TranslateXRel,
                                        RaOp::TranslateYRel,
                                        RaOp::ColorIncreasing,
                                        RaOp::SharpnessIncreasing,
                                        RaOp::AutoContrast,
                                        RaOp::SolarizeIncreasing,
                                        RaOp::SolarizeAdd,
                                        RaOp::ContrastIncreasing,
                                        RaOp::BrightnessIncreasing,
                                        RaOp::Equalize,
                                        RaOp::PosterizeIncreasing,
                                        RaOp::Invert};
const std::vector<double> kWeights = {3, 2, 2, 1, 1, .25, .25, .25, .05, .05, .05, .05, .05, .05, .05};

// A number that is the whole of `text`: an integer (digits only) or, with `real`, what Python's float()
// accepts of the forms a section can hold (digits, '.', an exponent; the section starts with a digit).
std::optional<double> parse_number(const std::string& text, bool real) {
  if (text.empty()) return std::nullopt;
  if (!real) {
    if (text.find_first_not_of("0123456789") != std::string::npos || text.size() > 9) return std::nullopt;
    return double(std::stol(text));
  }
  if (text.find_first_not_of("0123456789.eE+") != std::string::npos) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno != 0 || !std::isfinite(v)) return std::nullopt;
  return v;
}

// Standard normal from two uniforms (Box-Muller).
double gaussian(CounterRng& rng) {
  const double u1 = 1.0 - rng.uniform();  // (0, 1]
  const double u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace

const char* ra_op_name(RaOp op) {
  return kNames[size_t(op)];
}

std::optional<RaOp> ra_op_from_name(std::string_view name) {
  for (int i = 0; i < kRaOpCount; ++i)
    if (name == kNames[size_t(i)]) return RaOp(i);
  return std::nullopt;
}

RandAugmentConfig parse_rand_augment(const std::string& spec, const std::string& flag) {
  RandAugmentConfig cfg;
  cfg.spec = spec;
  if (spec.empty() || spec == "none") return cfg;
  const auto bad = [&](const std::string& why) {
    return ValueError(
        fmt::format("{} '{}': {} (timm's grammar: rand-m9-n2-mstd0.5-inc1, sections m, n, p, "
                    "mstd, mmax, inc and tweights)",
                    flag, spec, why));
  };
  std::vector<std::string> sections;
  for (size_t start = 0;;) {
    const size_t dash = spec.find('-', start);
    sections.push_back(spec.substr(start, dash == std::string::npos ? std::string::npos : dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  if (sections[0] != "rand")
    throw bad(
        fmt::format("starts with '{}'; only RandAugment ('rand-...') is supported, not timm's "
                    "AutoAugment or AugMix policies",
                    sections[0]));
  cfg.enabled = true;
  std::set<std::string> seen;
  for (size_t i = 1; i < sections.size(); ++i) {
    const std::string& s = sections[i];
    if (s.empty()) throw bad(fmt::format("section {} is empty", i + 1));
    if (s[0] == 't') {
      if (s != "tweights")
        throw bad(fmt::format("transform set '{}' in section '{}' is not supported (only 'tweights')",
                              s.substr(1), s));
      if (!seen.insert("t").second) throw bad(fmt::format("'{}' repeats a transform set", s));
      cfg.weighted = true;
      continue;
    }
    const size_t digit = s.find_first_of("0123456789");
    if (digit == std::string::npos) throw bad(fmt::format("section '{}' has no number", s));
    const std::string key = s.substr(0, digit), val = s.substr(digit);
    if (key != "m" && key != "n" && key != "p" && key != "mstd" && key != "mmax" && key != "inc")
      throw bad(fmt::format("unknown key '{}' in section '{}'", key, s));
    if (!seen.insert(key).second) throw bad(fmt::format("'{}' is given twice", key));
    const bool real = key == "p" || key == "mstd";
    const std::optional<double> v = parse_number(val, real);
    if (!v && !real && val.find_first_not_of("0123456789") == std::string::npos)
      throw bad(fmt::format("'{}' in section '{}' is too large", val, s));
    if (!v)
      throw bad(fmt::format("'{}' in section '{}' is not {}", val, s, real ? "a number" : "a whole number"));
    if (key == "m") {
      cfg.magnitude = int(*v);
    } else if (key == "n") {
      if (*v > 64) throw bad(fmt::format("n{} layers is more than 64", val));
      cfg.layers = int(*v);
    } else if (key == "p") {
      if (*v > 1) throw bad(fmt::format("p{} is not a probability in [0, 1]", val));
      cfg.prob = *v;
    } else if (key == "mstd") {
      cfg.magnitude_std = *v > 100 ? std::numeric_limits<double>::infinity() : *v;
    } else if (key == "mmax") {
      // timm reads mmax0 as "no bound given" (10); say so rather than guess.
      if (*v == 0) throw bad("mmax0 is not an upper bound above 0");
      cfg.magnitude_max = int(*v);
    } else {  // inc
      if (*v > 1) throw bad(fmt::format("inc{} is not 0 or 1", val));
      cfg.increasing = *v == 1;
    }
  }
  if (cfg.weighted && cfg.layers > int(kWeightedSet.size()))
    throw bad(fmt::format("n{} layers without replacement from the {} weighted ops", cfg.layers,
                          kWeightedSet.size()));
  return cfg;
}

std::vector<RaOp> ra_op_set(const RandAugmentConfig& cfg) {
  if (cfg.weighted) return kWeightedSet;
  return cfg.increasing ? kIncreasingSet : kDefaultSet;
}

std::vector<double> ra_op_weights(const RandAugmentConfig& cfg) {
  return cfg.weighted ? kWeights : std::vector<double>{};
}

bool ra_op_negates(RaOp op) {
  switch (op) {
    case RaOp::Rotate:
    case RaOp::ShearX:
    case RaOp::ShearY:
    case RaOp::TranslateXRel:
    case RaOp::TranslateYRel:
    case RaOp::ColorIncreasing:
    case RaOp::ContrastIncreasing:
    case RaOp::BrightnessIncreasing:
    case RaOp::SharpnessIncreasing:
      return true;
    default:
      return false;
  }
}

double ra_op_argument(RaOp op, double m, bool negate) {
  // timm's level functions, in its double arithmetic (level / 10 first).
  const double level = m / 10.0;
  const double sign = negate ? -1.0 : 1.0;
  switch (op) {
    case RaOp::AutoContrast:
    case RaOp::Equalize:
    case RaOp::Invert:
      return std::nan("");
    case RaOp::Rotate:
      return sign * (level * 30.0);
    case RaOp::Posterize:
      return double(int64_t(level * 4));
    case RaOp::PosterizeIncreasing:
      return double(4 - int64_t(level * 4));
    case RaOp::Solarize:
      return double(std::min<int64_t>(256, int64_t(level * 256)));
    case RaOp::SolarizeIncreasing:
      return double(256 - std::min<int64_t>(256, int64_t(level * 256)));
    case RaOp::SolarizeAdd:
      return double(std::min<int64_t>(128, int64_t(level * 110)));
    case RaOp::Color:
    case RaOp::Contrast:
    case RaOp::Brightness:
    case RaOp::Sharpness:
      return level * 1.8 + 0.1;
    case RaOp::ColorIncreasing:
    case RaOp::ContrastIncreasing:
    case RaOp::BrightnessIncreasing:
    case RaOp::SharpnessIncreasing:
      return std::max(0.1, 1.0 + sign * (level * 0.9));
    case RaOp::ShearX:
    case RaOp::ShearY:
      return sign * (level * 0.3);
    case RaOp::TranslateXRel:
    case RaOp::TranslateYRel:
      return sign * (level * 0.45);
  }
  return std::nan("");
}

Rgb ra_fill() {
  Rgb fill;
  for (int c = 0; c < 3; ++c) fill[size_t(c)] = uint8_t(std::lround(255.0 * double(kImageNetMean[c])));
  return fill;
}

void apply_ra_op(RaOp op, double arg, Image& img, Interpolation resample) {
  switch (op) {
    case RaOp::AutoContrast:
      return auto_contrast(img);
    case RaOp::Equalize:
      return equalize(img);
    case RaOp::Invert:
      return invert(img);
    case RaOp::Rotate:
      return rotate(img, arg, resample, ra_fill());
    case RaOp::Posterize:
    case RaOp::PosterizeIncreasing:
      // timm returns the image unchanged at 8 bits and more; 0 bits is black (Note [Posterize to 0 bits]).
      if (arg >= 8) return;
      return posterize(img, int(arg));
    case RaOp::Solarize:
    case RaOp::SolarizeIncreasing:
      return solarize(img, int(arg));
    case RaOp::SolarizeAdd:
      return solarize_add(img, int(arg));
    case RaOp::Color:
    case RaOp::ColorIncreasing:
      return color(img, arg);
    case RaOp::Contrast:
    case RaOp::ContrastIncreasing:
      return contrast(img, arg);
    case RaOp::Brightness:
    case RaOp::BrightnessIncreasing:
      return brightness(img, arg);
    case RaOp::Sharpness:
    case RaOp::SharpnessIncreasing:
      return sharpness(img, arg);
    case RaOp::ShearX:
      return shear_x(img, arg, resample, ra_fill());
    case RaOp::ShearY:
      return shear_y(img, arg, resample, ra_fill());
    case RaOp::TranslateXRel:  // timm: pixels = fraction * image width (PIL's size[0])
      return translate_x(img, arg * double(img.width), resample, ra_fill());
    case RaOp::TranslateYRel:
      return translate_y(img, arg * double(img.height), resample, ra_fill());
  }
}

std::vector<RaApplied> rand_augment(const RandAugmentConfig& cfg, Image& img, Interpolation resample,
                                    CounterRng& rng) {
  std::vector<RaApplied> applied;
  if (!cfg.enabled || cfg.layers == 0) return applied;
  const std::vector<RaOp> set = ra_op_set(cfg);
  std::vector<RaOp> chosen;
  if (!cfg.weighted) {
    for (int i = 0; i < cfg.layers; ++i) chosen.push_back(set[size_t(rng.below(int64_t(set.size())))]);
  } else {
    // Successive draws in proportion to the weights of the ops not yet chosen. numpy's choice(replace=False,
    // p=...) draws in rounds instead; for n = 2 the two give each ordered pair (a, b) the same probability,
    // p_a p_b / (1 - p_a).
    std::vector<double> w = kWeights;
    for (int i = 0; i < cfg.layers; ++i) {
      double total = 0;
      for (double v : w) total += v;
      double u = rng.uniform() * total;
      size_t k = 0;
      while (k + 1 < w.size() && (w[k] == 0 || u >= w[k])) u -= w[k++];
      while (w[k] == 0) --k;  // rounding carried u past the last op still in play
      chosen.push_back(set[k]);
      w[k] = 0;
    }
  }
  for (RaOp op : chosen) {
    if (cfg.prob < 1.0 && rng.uniform() > cfg.prob) continue;  // timm: random() > prob skips
    double m = cfg.magnitude;
    if (std::isinf(cfg.magnitude_std))
      m = rng.uniform(0.0, m);
    else if (cfg.magnitude_std > 0)
      m = m + cfg.magnitude_std * gaussian(rng);
    m = std::max(0.0, std::min(m, double(cfg.magnitude_max)));
    const bool negate = ra_op_negates(op) && rng.uniform() > 0.5;
    const double arg = ra_op_argument(op, m, negate);
    apply_ra_op(op, arg, img, resample);
    applied.push_back({op, m, arg});
  }
  return applied;
}

}  // namespace cz
