// Geometry and pixel transforms the loader applies to each decoded image: random-resized-crop parameters,
// one resampling pass that crops, resizes, flips and normalises into the batch tensor, and its 8-bit form
// for RandAugment (resize_u8.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/image/counter_rng.h"
#include "io/image/image.h"

namespace cz {

// A window of the source image, in whole pixels: rows [y, y+h), columns [x, x+w).
// CropBox: io/image/image.h (Dataset::read_crop hands one back).

// timm's RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3)) followed by a horizontal flip with p = 0.5: up
// to ten tries of an area fraction uniform in `scale` and an aspect ratio log-uniform in `ratio` that fits
// the image, else the largest centred crop whose ratio is clamped into `ratio`.
CropBox random_resized_crop(int64_t height, int64_t width, CounterRng& rng);

// The resize filter (`--interpolation`): PIL's BILINEAR (triangle) or BICUBIC (cubic convolution, a = -0.5),
// both widened by the scale when shrinking so every source pixel contributes, as PIL's resize does.
enum class Interpolation { bilinear, bicubic };
// "bilinear" | "bicubic"; anything else is a ValueError naming `flag`.
Interpolation parse_interpolation(const std::string& name, const std::string& flag = "--interpolation");
const char* interpolation_name(Interpolation interpolation);

// Resamples `box` of `src` to size x size and writes it normalised with ImageNet mean/std, NHWC, to `out`
// (size*size*3 floats), in float throughout (no rounding to 8 bits on the way).
void resample_normalised(const Image& src, const CropBox& box, int64_t size, float* out,
                         Interpolation interpolation = Interpolation::bilinear);

// Note [8-bit resize]: the same crop, resize and flip into an 8-bit image, with PIL's own arithmetic (its
// Resample.c: coefficients in 22-bit fixed point, a horizontal pass rounded to 8 bits, then a vertical one),
// so that it equals what timm's RandomResizedCropAndInterpolation (torchvision's resized_crop: PIL's crop,
// then resize) gives RandAugment. The loader takes this path when RandAugment is on (it works on 8-bit
// images, as timm's does on PIL's); without it the float path above keeps the extra precision.
// out: size x size, RGB; resized (not reallocated) when it already has that size.
// Runs on the widest kernel this CPU has (Note [Resize kernels per instruction set], resize_u8_kernels.h);
// the overload names one (tests, measurements).
void resample_u8(const Image& src, const CropBox& box, int64_t size, Interpolation interpolation, Image& out);
enum class ResizeKernel;
void resample_u8(const Image& src, const CropBox& box, int64_t size, Interpolation interpolation, Image& out,
                 ResizeKernel kernel);
// The passes' intermediate images, kept by a caller that resizes image after image (the loader's workers):
// without it each call allocates and zero-fills three of them (page faults and memset: 10% of a loader
// thread's time, measured). Grows to the largest crop seen.
struct ResampleScratch {
  std::vector<int32_t> acc;
  std::vector<uint8_t> t0, t1, mid;
};
void resample_u8(const Image& src, const CropBox& box, int64_t size, Interpolation interpolation, Image& out,
                 ResampleScratch& scratch);

// (v / 255 - mean) / std per channel, as resample_normalised ends. img: 8-bit RGB; out: h*w*3 floats.
void normalise_u8(const Image& img, float* out);

}  // namespace cz
