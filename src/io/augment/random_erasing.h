// timm's RandomErasing (`--reprob P --remode const|rand|pixel --recount N`) on a normalised image.
//
// Note [Random erasing]: as timm's RandomErasing(probability=P, mode=M, max_count=N), applied as its
// training transform applies it, per image after normalisation (so `const` writes 0, the mean colour): with
// probability P, a count drawn uniformly from 1..N, and for each box up to ten tries of an area uniform in
// [0.02, 1/3] of the image divided by the count and an aspect ratio (h / w) log-uniform in [0.3, 1/0.3],
// h = round(sqrt(area * ratio)), w = round(sqrt(area / ratio)) (half to even, as Python's round), kept when
// h < H and w < W, placed uniformly (top in [0, H - h], left in [0, W - w]); the box is filled with 0
// (const), one standard normal value per channel (rand) or one per pixel and channel (pixel). The draws are
// ours (Philox, keyed per sample by the loader: Note [Sampling]), so a box is not timm's box; the
// statistics are (RandomErasing tests against tests/data/random_erasing_timm.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/image/counter_rng.h"

namespace cz {

enum class EraseMode { constant, rand, pixel };
// "const" | "rand" | "pixel"; anything else is a ValueError naming `flag`.
EraseMode parse_erase_mode(const std::string& name, const std::string& flag = "--remode");

struct RandomErasingConfig {
  double probability = 0;  // 0: off
  EraseMode mode = EraseMode::pixel;
  int max_count = 1;  // boxes per erased image: uniform in [1, max_count]
};

struct EraseBox {
  int64_t top = 0, left = 0, h = 0, w = 0;
};

// A drawn box and what fills it: 3 values (one per channel: const's zeros, rand's colour) or, `per_pixel`,
// h x w x 3 of them row by row.
struct ErasePatch {
  EraseBox box;
  bool per_pixel = false;
  std::vector<float> values;
};

// The draws of random_erase, without an image: the boxes in the order drawn and their values (erasing does
// not read the pixels, so they can be written later, where the image is normalised: model_input.h).
std::vector<ErasePatch> draw_erasing(const RandomErasingConfig& cfg, int64_t height, int64_t width,
                                     CounterRng& rng);
// Writes patches into img (height x width x 3 f32, NHWC) in order.
void write_erasing(const std::vector<ErasePatch>& patches, float* img, int64_t width);

// Erases boxes of img (h x w x 3 f32, NHWC, normalised) in place; returns them in the order drawn.
std::vector<EraseBox> random_erase(const RandomErasingConfig& cfg, float* img, int64_t height, int64_t width,
                                   CounterRng& rng);

}  // namespace cz
