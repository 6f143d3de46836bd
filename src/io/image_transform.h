// Geometry and pixel transforms the loader applies to each decoded image: random-resized-crop parameters,
// and one resampling pass that crops, resizes, flips and normalises into the batch tensor.
#pragma once

#include <cstdint>

#include "io/dataset.h"
#include "io/sampler.h"

namespace cz {

// A window of the source image, in whole pixels: rows [y, y+h), columns [x, x+w).
struct CropBox {
  int64_t y = 0, x = 0, h = 0, w = 0;
  bool flip = false;  // mirror left-right
};

// timm's RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3)) followed by a horizontal flip with p = 0.5: up
// to ten tries of an area fraction uniform in `scale` and an aspect ratio log-uniform in `ratio` that fits
// the image, else the largest centred crop whose ratio is clamped into `ratio`.
CropBox random_resized_crop(int64_t height, int64_t width, CounterRng& rng);

// Resamples `box` of `src` to size x size and writes it normalised with ImageNet mean/std, NHWC, to `out`
// (size*size*3 floats). Bilinear when enlarging; when shrinking the triangle filter widens with the scale, so
// every source pixel contributes (area-aware, like PIL's antialiased bilinear) instead of aliasing.
void resample_normalised(const Image& src, const CropBox& box, int64_t size, float* out);

}  // namespace cz
