// The augmentation entries of the flag table (flags.h), placed in --help's order after --augment:
// Mixup/CutMix and --dump-batches, then the loader's per-image augmentations (--interpolation, RandAugment's
// --aa, random erasing's --reprob/--remode/--recount); timm's train.py flags with its meanings.
#include <algorithm>
#include <cmath>

#include "dist/train/flags_table.h"
#include "io/augment/image_transform.h"
#include "io/augment/randaugment.h"
#include "io/augment/random_erasing.h"
#include "io/data/batch_dump.h"
#include "tensor/check.h"

namespace cz::train {
namespace {

using C = const TrainConfig&;
using F = const Flag&;
using T = TrainConfig;

void check_alpha(double v, const char* name) {
  CZ_CHECK(std::isfinite(v) && v >= 0, "{} must be a finite number >= 0 (0: off), got {}", name, v);
}
void check_probability(double v, const char* name) {
  CZ_CHECK(v >= 0 && v <= 1, "{} must be in [0, 1], got {}", name, v);
}

}  // namespace

std::vector<Flag> augment_flags() {
  return {
      {.name = "--mixup",
       .field = &T::mixup,
       .group = kAugmentGroup,
       .help = "Mixup alpha: images and targets mixed as lam x + (1 - lam) x', lam ~ Beta(A, A), with image "
               "n-1-i of the rank's micro-batch (0: off); the loss becomes the soft-target cross-entropy",
       .check = [](C c, F f) { check_alpha(c.mixup, f.name); },
       .ranks_agree = true,
       .json_key = "mixup"},
      {.name = "--cutmix",
       .field = &T::cutmix,
       .group = kAugmentGroup,
       .help = "CutMix alpha: a box of area (1 - lam) pasted from image n-1-i, lam ~ Beta(A, A) (0: off)",
       .check = [](C c, F f) { check_alpha(c.cutmix, f.name); },
       .ranks_agree = true,
       .json_key = "cutmix"},
      {.name = "--cutmix-minmax",
       .field = &T::cutmix_minmax,
       .group = kAugmentGroup,
       .help =
           "LO,HI: CutMix box sides uniform in [LO, HI) of the image's instead of from lam (turns CutMix on)",
       .check =
           [](C c, F f) {
             if (c.cutmix_minmax.empty()) return;
             const auto [lo, hi] = parse_cutmix_minmax(c.cutmix_minmax, f.name);
             const int64_t a = int64_t(double(c.image_size) * lo), b = int64_t(double(c.image_size) * hi);
             CZ_CHECK(a < b, "{} {} with {} {}: box sides are drawn from [{}, {}) pixels, which is empty",
                      f.name, c.cutmix_minmax, flag_name(&T::image_size), c.image_size, a, b);
           },
       .ranks_agree = true,
       .json_key = "cutmix_minmax"},
      {.name = "--mixup-prob",
       .field = &T::mixup_prob,
       .group = kAugmentGroup,
       .help = "probability of mixing a batch (pair, image) at all",
       .check = [](C c, F f) { check_probability(c.mixup_prob, f.name); },
       .ranks_agree = true,
       .json_key = "mixup_prob"},
      {.name = "--mixup-switch-prob",
       .field = &T::mixup_switch_prob,
       .group = kAugmentGroup,
       .help = "with both --mixup and --cutmix: probability of CutMix rather than Mixup",
       .check = [](C c, F f) { check_probability(c.mixup_switch_prob, f.name); },
       .ranks_agree = true,
       .json_key = "mixup_switch_prob"},
      {.name = "--mixup-mode",
       .field = &T::mixup_mode,
       .group = kAugmentGroup,
       .help = "batch | pair | elem: one lam per micro-batch, per pair (i, n-1-i), or per image",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.mixup_mode == "batch" || c.mixup_mode == "pair" || c.mixup_mode == "elem",
                      "{} must be batch, pair or elem, got '{}'", f.name, c.mixup_mode);
             // Note [Mixing within a micro-batch]: image i is mixed with image n-1-i of the micro-batch.
             CZ_CHECK(!c.mix_config().active() || c.micro_batch % 2 == 0,
                      "{} {}: Mixup/CutMix mixes image i with image n-1-i of each rank's micro-batch, which "
                      "must be even",
                      flag_name(&T::micro_batch), c.micro_batch);
           },
       .ranks_agree = true,
       .json_key = "mixup_mode"},
      {.name = "--dump-batches",
       .field = &T::dump_batches,
       .group = kDataGroup,
       .help = "FILE.h5: write every training batch as the model receives it (images, targets, sources, "
               "lam and box; FILE.rankR.h5 per rank under mpirun); FILE.png: a picture of the first batch",
       .check =
           [](C c, F f) {
             if (!c.dump_batches.empty()) BatchDump::format_of(c.dump_batches, f.name);
           }},
      {.name = "--interpolation",
       .field = &T::interpolation,
       .group = kAugmentGroup,
       .help = "resize filter of the training crop and of evaluation: bilinear | bicubic (PIL's, as timm's; "
               "the ConvNeXt recipe's is bicubic); also RandAugment's geometric ops'",
       .check = [](C c, F f) { parse_interpolation(c.interpolation, f.name); },
       .ranks_agree = true,
       .json_key = "interpolation"},
      {.name = "--aa",
       .field = &T::aa,
       .group = kAugmentGroup,
       .help =
           "RandAugment on training images, timm's string: rand-m9-mstd0.5-inc1 is the ConvNeXt recipe's "
           "(m magnitude, n ops per image, p each op's probability, mstd magnitude noise, mmax its bound, "
           "inc1 the increasing ops, tweights timm's weighted choice); empty or none: off",
       .check = [](C c, F f) { parse_rand_augment(c.aa, f.name); },
       .ranks_agree = true,
       .json_key = "aa"},
      {.name = "--reprob",
       .field = &T::reprob,
       .group = kAugmentGroup,
       .help = "random erasing: the probability that a training image gets erased boxes, after normalisation "
               "(timm's; the ConvNeXt recipe's 0.25); 0: off",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.reprob) && c.reprob >= 0 && c.reprob <= 1,
                      "{} must be a probability in [0, 1], got {}", f.name, c.reprob);
           },
       .ranks_agree = true,
       .json_key = "reprob"},
      {.name = "--remode",
       .field = &T::remode,
       .group = kAugmentGroup,
       .help =
           "random erasing's fill: const (0, the mean colour) | rand (a normal colour per box) | pixel (a "
           "normal value per pixel and channel)",
       .check = [](C c, F f) { parse_erase_mode(c.remode, f.name); },
       .ranks_agree = true,
       .json_key = "remode"},
      {.name = "--recount",
       .field = &T::recount,
       .group = kAugmentGroup,
       .help = "random erasing: each erased image gets 1 to N boxes (uniform), each of a 1/count share of "
               "the area",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.recount >= 1 && c.recount <= 64, "{} must be in [1, 64], got {}", f.name, c.recount);
           },
       .ranks_agree = true,
       .json_key = "recount"},
  };
}

// The whole section: label smoothing, drop path, EMA and --augment, then augment_flags() after --augment.
std::vector<Flag> augment_group_flags() {
  std::vector<Flag> t = {
      {.name = "--label-smoothing",
       .field = &T::label_smoothing,
       .group = kAugmentGroup,
       .help = "cross-entropy label smoothing",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 1, "{} must be in [0, 1), got {}", f.name,
                      c.label_smoothing);
           },
       .json_key = "label_smoothing"},
      {.name = "--drop-path",
       .field = &T::drop_path,
       .group = kAugmentGroup,
       .help = "stochastic depth rate of the last block",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.drop_path >= 0 && c.drop_path < 1, "{} must be in [0, 1), got {}", f.name,
                      c.drop_path);
           },
       .ranks_agree = true,
       .json_key = "drop_path"},
      {.name = "--ema-decay",
       .field = &T::ema_decay,
       .group = kAugmentGroup,
       .help = "EMA of weights, evaluated alongside (0: off)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.ema_decay >= 0 && c.ema_decay < 1, "{} must be in [0, 1) (0 disables EMA), got {}",
                      f.name, c.ema_decay);
           },
       .ranks_agree = true,
       .resume_identity = true,
       // Whether there is EMA state to load, not its decay: a resumed run may change the decay.
       .resume_spelling = [](C c) { return std::string(c.ema_decay > 0 ? "on" : "off"); },
       .json_key = "ema_decay"},
      {.name = "--augment",
       .field = &T::augment,
       .group = kAugmentGroup,
       .help = "random-resized-crop and horizontal flip",
       .json_key = "augment"},
  };
  const auto augment =
      std::find_if(t.begin(), t.end(), [](const Flag& f) { return f.field == FlagField(&T::augment); });
  std::vector<Flag> more = augment_flags();
  t.insert(augment + 1, more.begin(), more.end());
  return t;
}

}  // namespace cz::train
