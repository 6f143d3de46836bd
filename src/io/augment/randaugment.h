// timm's RandAugment (`--aa rand-m9-mstd0.5-inc1`): the grammar of its config string, its op sets, its
// magnitude-to-argument mapping, and the per-image draws, over the PIL-exact ops of randaugment_ops.h.
//
// Note [RandAugment]: as timm's RandAugment(rand_augment_ops(...)): each image gets n ops drawn uniformly
// with replacement from the set (or, with `tweights`, by timm's weights without replacement); each is applied
// with probability p, at magnitude m plus Gaussian noise of standard deviation mstd (uniform in [0, m] when
// mstd > 100), clamped to [0, mmax] (10 unless given); the level functions turn the magnitude into the op's
// argument (Rotate: m / 10 * 30 degrees, negated with probability 1/2, ...: ra_op_argument). Geometric ops
// fill with timm's factory's colour, round(255 * ImageNet mean) = (124, 116, 104), and resample with the
// crop's interpolation, as timm's create_transform passes both. The draws come from the caller's stream (the
// loader's is keyed by seed, epoch and the sample's position: Note [Sampling], loader.h), not from Python's
// random, so the ops chosen differ from timm's run while their distribution is the same.
//
// Note [Posterize to 0 bits]: timm's Posterize keeps int(m / 10 * 4) bits and PosterizeIncreasing 4 minus
// that, so Posterize below m = 2.5 and PosterizeIncreasing at m = 10 ask PIL for 0 bits. Earlier PIL made
// that a black image (mask ~255), as TensorFlow's posterize does; Pillow 13.0.0 raises ValueError ("bits
// must be between or equal to 1 and 8"; its development tree of August 2026 did not yet), so timm 1.0.31 on
// Pillow 13 stops its data loader the first time it happens: with rand-m9-mstd0.5-inc1, PosterizeIncreasing
// is drawn and applied at a clamped magnitude of 10 for about one image in 650 (2 layers x 1/15 x 1/2 x
// P(N(9, 0.5) >= 10) = 2.3%). We keep the older meaning, a black image, which is what the ConvNeXt recipe was
// trained with (PIL 8 era); the fixture (tools/make_randaugment_fixtures.py) leaves these cases out and
// RandAugmentOps.PosterizeZeroBits checks the black image.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/augment/image_transform.h"
#include "io/augment/randaugment_ops.h"
#include "io/image/counter_rng.h"
#include "io/image/image.h"

namespace cz {

// timm's op names. The `Increasing` variants are the `inc1` set's: their strength grows with the magnitude.
enum class RaOp {
  AutoContrast,
  Equalize,
  Invert,
  Rotate,
  Posterize,
  PosterizeIncreasing,
  Solarize,
  SolarizeIncreasing,
  SolarizeAdd,
  Color,
  ColorIncreasing,
  Contrast,
  ContrastIncreasing,
  Brightness,
  BrightnessIncreasing,
  Sharpness,
  SharpnessIncreasing,
  ShearX,
  ShearY,
  TranslateXRel,
  TranslateYRel
};
inline constexpr int kRaOpCount = 21;
const char* ra_op_name(RaOp op);
std::optional<RaOp> ra_op_from_name(std::string_view name);

struct RandAugmentConfig {
  bool enabled = false;
  int magnitude = 10;        // m
  int layers = 2;            // n: ops per image
  double prob = 0.5;         // p: each op's probability
  double magnitude_std = 0;  // mstd; infinity: uniform in [0, m]
  int magnitude_max = 10;    // mmax: the clamp's upper bound
  bool increasing = false;   // inc1: the increasing set
  bool weighted = false;     // tweights: timm's weighted set (_RAND_WEIGHTED_0), no replacement
  std::string spec;          // the string it was parsed from
};

// Parses timm's `rand-...` string: sections separated by '-', the first "rand", then keys with their numbers
// (m, n, p, mstd, mmax, inc) or t<name> (only `tweights`); "" or "none" is off. Stricter than timm, which
// ignores a section without a number and takes unknown transform names as the default set: anything it
// would not run as written is a ValueError naming `flag`, the string and the bad section.
RandAugmentConfig parse_rand_augment(const std::string& spec, const std::string& flag = "--aa");

// The ops the config chooses among, and their choice weights (empty: uniform).
std::vector<RaOp> ra_op_set(const RandAugmentConfig& cfg);
std::vector<double> ra_op_weights(const RandAugmentConfig& cfg);

// timm's level function: the op's argument at `magnitude` (after noise and clamping), `negate` being
// _randomly_negate's coin where the op has one. Rotate: degrees; Posterize: bits; Solarize: threshold;
// SolarizeAdd: the addend; Color/Contrast/Brightness/Sharpness: the blend factor; Shear: the factor;
// TranslateRel: the fraction of the width/height. NaN for AutoContrast, Equalize and Invert.
double ra_op_argument(RaOp op, double magnitude, bool negate);
bool ra_op_negates(RaOp op);  // whether the level function draws a sign

// Applies `op` with the argument ra_op_argument gives.
void apply_ra_op(RaOp op, double arg, Image& img, Interpolation resample);

// timm's fill colour for the geometric ops: round(255 * kImageNetMean), per channel.
Rgb ra_fill();

// What rand_augment did to one image, in order (the ops whose coin said skip are not listed).
struct RaApplied {
  RaOp op;
  double magnitude;  // after noise and clamping
  double arg;
};

// RandAugment on one 8-bit image (Note [RandAugment]), drawing from `rng`.
std::vector<RaApplied> rand_augment(const RandAugmentConfig& cfg, Image& img, Interpolation resample,
                                    CounterRng& rng);

}  // namespace cz
