// Mixup and CutMix with timm's meanings (timm.data.mixup.Mixup): the parameters of one batch's mixing drawn
// from a counter-based stream, applied to the batch's normalised images in place, and the soft targets they
// make, with label smoothing folded in.
//
// Note [Mixing within a micro-batch]: the loader mixes each rank's micro-batch as it builds it, image i with
// image n-1-i of the same micro-batch (timm's flip), as timm mixes each GPU's batch. The draw is keyed by
// (seed, epoch, the position in the epoch of the micro-batch's first sample) alone, so it is the same
// whatever the world size, thread count or resume point, and a micro-batch covering the same positions is
// mixed the same way: W ranks with micro-batch m see what one rank with micro-batch m and --grad-accum W
// sees, pixels, pairs and targets alike (one rank with micro-batch W*m mixes over W*m images instead, as timm
// would on one bigger GPU). Mixing in the loader, once the batch's images are augmented and normalised (per-
// image augmentations such as random erasing belong before it, as in timm), keeps the data path straight:
// the trainer receives the images and targets the model trains on, `--dump-batches` writes what the model
// sees, and the work runs on the loader's threads ahead of the step. Mixup commutes with the per-channel
// normalisation (lam + (1 - lam) = 1), so mixing normalised images gives timm's values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace cz {

class CounterRng;

enum class MixMode { batch, pair, elem };      // one draw per batch, per pair (i, n-1-i), per image
MixMode parse_mix_mode(const std::string& s);  // "batch" | "pair" | "elem", else ValueError
const char* mix_mode_name(MixMode m);

struct MixConfig {
  double mixup_alpha = 0;   // Beta(a, a) for Mixup's lam; 0: no Mixup
  double cutmix_alpha = 0;  // Beta(a, a) for CutMix's lam; 0: no CutMix
  // CutMix's box side as a fraction of the image's, uniform in [lo, hi) per dimension, instead of from lam
  // (timm then forces cutmix_alpha to 1, which only makes CutMix active).
  std::optional<std::pair<double, double>> cutmix_minmax;
  double prob = 1.0;         // probability that a batch (pair, image) is mixed at all
  double switch_prob = 0.5;  // with both active: probability of CutMix rather than Mixup
  MixMode mode = MixMode::batch;
  double label_smoothing = 0;  // folded into the targets: off = s / K, on = 1 - s + s / K
  int64_t num_classes = 0;     // K, the width of the targets

  // timm's mixup_active: --mixup > 0, --cutmix > 0 or --cutmix-minmax given.
  bool active() const { return mixup_alpha > 0 || cutmix_alpha > 0 || cutmix_minmax.has_value(); }
};

// ValueError unless the values are in range for images of `image_size` pixels: alphas >= 0, probabilities in
// [0, 1], smoothing in [0, 1), and a minmax box range holding at least one whole pixel (timm draws the side
// from [int(S lo), int(S hi)), which must not be empty).
void check_mix_config(const MixConfig& c, int64_t image_size);

// "LO,HI" with 0 <= LO < HI <= 1; ValueError naming `flag` otherwise.
std::pair<double, double> parse_cutmix_minmax(const std::string& s, const std::string& flag);

// A CutMix box: rows [y0, y1) and columns [x0, x1) of the image (empty when either range is).
struct MixBox {
  int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;
  int64_t area() const { return (y1 - y0) * (x1 - x0); }
};

// How image i of a batch was made: lam * own + (1 - lam) * partner's pixels (Mixup), or the partner's
// pixels inside the box (CutMix, lam = 1 - box area / image area). Its target: lam * own one-hot +
// (1 - lam) * partner's, smoothed. lam == 1: left as it was.
struct SampleMix {
  int64_t partner = 0;  // the image mixed in: n - 1 - i
  double lam = 1;       // in pair and elem modes a float value, as timm keeps it
  bool cutmix = false;
  MixBox box;
};

struct MixParams {
  MixMode mode = MixMode::batch;
  std::vector<SampleMix> samples;  // one per image of the batch
};

// The Philox stream a micro-batch's mixing draws from (Note [Mixing within a micro-batch]).
CounterRng mix_stream(uint64_t seed, int64_t epoch, int64_t first_position);

// timm's draws for a batch of n images of height x width (n even), in its order of decisions.
MixParams draw_mix(const MixConfig& c, int64_t n, int64_t height, int64_t width, CounterRng& rng);

// Mixes images (n, H, W, C) f32, contiguous, CPU, in place, as timm's Mixup does to its (n, C, H, W) batch:
// out_i = in_i * L + in_partner * M rounded as timm rounds (L = f32(lam); M = f32(1 - lam), taken in f64 in
// batch mode and in f32 in pair and elem modes), and CutMix boxes copied from the unmixed partner. n even,
// every image paired with image n-1-i (draw_mix's pairing, timm's flip).
void apply_mix(const MixParams& p, Tensor& images);

// The weights (L, M) apply_mix rounds lam to in `mode` (above).
std::pair<float, float> mix_weights(MixMode mode, double lam);

// The soft targets (n, num_classes) f32 of labels (n) i64: timm's mixup_target, bit for bit.
Tensor mix_targets(const MixParams& p, const Tensor& labels, int64_t num_classes, double smoothing);

}  // namespace cz
