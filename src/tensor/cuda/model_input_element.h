// One element of the model's input made from a batch of 8-bit pixels (Note [Normalising on the device],
// src/io/data/model_input.h): normalised, erased and mixed, by host/device functions that the CPU loop
// (model_input.cpp) and the CUDA kernel (model_input.cu) both call, so the kernel's
// per-thread arithmetic is the CPU's, tested on the CPU. Plain C++ apart from CZ_HD: no CUDA header needed.
#pragma once

#include <cstdint>

#include "tensor/cuda/host_device.h"

namespace cz::batch_input {

// A random-erasing box of one image (Note [Random erasing]): its values start at `offset` of the batch's
// value array, one per channel, or with `per_pixel` one per pixel and channel (row-major h x w x 3).
struct EraseRect {
  int32_t top = 0, left = 0, h = 0, w = 0;
  int64_t offset = 0;
  int32_t per_pixel = 0;
};

enum : int32_t { kNoMix = 0, kBlend = 1, kCutMix = 2 };

// What is done to image i after normalisation: its erase boxes [erase_first, erase_first + erase_count) of
// the batch's, in the order drawn (a later box covers an earlier one), then mixing with image `partner`:
// own * l + partner * m (two roundings and a sum, as timm's mul_, mul_, add_), or the partner's pixels
// inside rows [y0, y1) and columns [x0, x1) (CutMix). The partner's pixels are its erased, unmixed ones.
struct ImageParams {
  int32_t erase_first = 0, erase_count = 0;
  int32_t partner = 0, mix = kNoMix;
  float l = 1, m = 0;
  int32_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;
};

// (v / 255 - mean) / std as one multiply and one add per channel, each rounded (normalise_u8's arithmetic).
struct Normalisation {
  float mul[3], add[3];
};

CZ_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);  // never contracted into a multiply-add
#else
  return a * b;  // model_input.cpp is compiled with -ffp-contract=off
#endif
}
CZ_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

struct BatchView {
  const uint8_t* pixels = nullptr;  // (n, height, width, 3)
  const ImageParams* images = nullptr;
  const EraseRect* rects = nullptr;
  const float* values = nullptr;
  int64_t height = 0, width = 0;
  Normalisation norm{};
};

// Image i's element (y, x, c) after normalisation and erasing.
CZ_HD float unmixed(const BatchView& b, int64_t i, int64_t y, int64_t x, int c) {
  const ImageParams& q = b.images[i];
  for (int32_t k = q.erase_count - 1; k >= 0; --k) {
    const EraseRect& r = b.rects[q.erase_first + k];
    if (y >= r.top && y < r.top + r.h && x >= r.left && x < r.left + r.w)
      return b.values[r.offset + (r.per_pixel ? ((y - r.top) * r.w + (x - r.left)) * 3 + c : c)];
  }
  const float v = float(b.pixels[((i * b.height + y) * b.width + x) * 3 + c]);
  return add_rn(mul_rn(v, b.norm.mul[c]), b.norm.add[c]);
}

// Image i's element (y, x, c) as the model sees it: normalised, erased, mixed.
CZ_HD float element(const BatchView& b, int64_t i, int64_t y, int64_t x, int c) {
  const ImageParams& q = b.images[i];
  if (q.mix == kCutMix && y >= q.y0 && y < q.y1 && x >= q.x0 && x < q.x1)
    return unmixed(b, q.partner, y, x, c);
  const float own = unmixed(b, i, y, x, c);
  if (q.mix != kBlend) return own;
  return add_rn(mul_rn(own, q.l), mul_rn(unmixed(b, q.partner, y, x, c), q.m));
}

// Element e of the (n, height, width, 3) output, in memory order: the CUDA kernel's thread e and the CPU
// loop.
CZ_HD float element_at(const BatchView& b, int64_t e) {
  const int c = int(e % 3);
  const int64_t p = e / 3, x = p % b.width, row = p / b.width;
  return element(b, row / b.height, row % b.height, x, c);
}

}  // namespace cz::batch_input
