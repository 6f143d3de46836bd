// The 8-bit resize's kernels (Note [Resize kernels per instruction set], src/io/augment/resize_u8_kernels.h):
// every kernel this CPU runs gives the scalar loops' bytes exactly (the scalar loops equal PIL's:
// RandAugmentFixture.EightBitResizeEqualsTorchvisionResizedCrop), over random images, crops, sizes, both
// filters, both pass orders and the flip; and CZ_RESIZE_KERNEL's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "io/augment/image_transform.h"
#include "io/augment/resize_u8_kernels.h"
#include "tensor/check.h"

namespace cz {
namespace {

const ResizeKernel kVectorKernels[] = {ResizeKernel::baseline, ResizeKernel::avx2, ResizeKernel::avx512};

Image random_image(int64_t h, int64_t w, std::mt19937& gen, bool smooth) {
  Image img{h, w, std::vector<uint8_t>(size_t(h * w * 3))};
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        // Smooth gradients and noise: the noise drives the bicubic's overshoot into the clamp at 0 and 255.
        const int v = smooth ? int((x * 255 / std::max<int64_t>(w, 1) + y * 3 + c * 60) % 256) : byte(gen);
        img.pixels[size_t((y * w + x) * 3 + c)] = uint8_t(v);
      }
  return img;
}

TEST(ResizeKernels, EveryKernelEqualsTheScalarLoopsBitForBit) {
  std::mt19937 gen(12345);
  int ran = 0;
  for (ResizeKernel kernel : kVectorKernels) {
    if (!resize_kernel_runs_here(kernel)) continue;
    ++ran;
    SCOPED_TRACE(resize_kernel_name(kernel));
    // Shrinking (by a lot, so the taps are many), growing, equal on one axis (that pass skipped), 1 pixel,
    // crops taller than wide (the vertical pass first) and wider than tall.
    const std::vector<std::array<int64_t, 3>> cases = {
        {375, 500, 224}, {500, 375, 224}, {1200, 90, 64},  {90, 1200, 64},  {17, 23, 64},
        {224, 224, 224}, {224, 300, 224}, {300, 224, 224}, {1, 1, 5},       {1, 9, 1},
        {9, 1, 3},       {33, 47, 31},    {64, 64, 1},     {2000, 1500, 96}};
    for (const auto& [h, w, size] : cases)
      for (bool smooth : {false, true}) {
        const Image src = random_image(h, w, gen, smooth);
        for (Interpolation f : {Interpolation::bilinear, Interpolation::bicubic})
          for (bool flip : {false, true})
            for (int crop = 0; crop < 3; ++crop) {
              CropBox box{0, 0, h, w, flip};
              if (crop > 0) {  // a random window, as RandomResizedCrop cuts
                std::uniform_int_distribution<int64_t> hh(1, h), ww(1, w);
                box.h = hh(gen), box.w = ww(gen);
                box.y = std::uniform_int_distribution<int64_t>(0, h - box.h)(gen);
                box.x = std::uniform_int_distribution<int64_t>(0, w - box.w)(gen);
              }
              Image want, got;
              resample_u8(src, box, size, f, want, ResizeKernel::scalar);
              resample_u8(src, box, size, f, got, kernel);
              ASSERT_EQ(got.height, size);
              ASSERT_EQ(got.width, size);
              ASSERT_EQ(got.pixels, want.pixels)
                  << h << "x" << w << " crop " << box.y << "," << box.x << " " << box.h << "x" << box.w
                  << " -> " << size << " " << interpolation_name(f) << (flip ? " flipped" : "");
            }
      }
  }
  // The baseline kernel runs on every CPU, so at least it was compared.
  EXPECT_GE(ran, 1);
  std::printf("kernels compared with the scalar loops: %d (widest here: %s)\n", ran,
              resize_kernel_name(default_resize_kernel()));
}

// The loader's workers keep one ResampleScratch and one output image from one image to the next: what a
// previous, larger or smaller, crop left in them never shows (filled with 0xAB first to make sure).
TEST(ResizeKernels, AReusedScratchGivesTheFreshResult) {
  std::mt19937 gen(777);
  ResampleScratch scratch;
  scratch.acc.assign(1 << 16, int32_t(0xABABABAB));
  scratch.t0.assign(1 << 20, 0xAB);
  scratch.t1.assign(1 << 20, 0xAB);
  scratch.mid.assign(1 << 20, 0xAB);
  Image got;
  got.pixels.assign(size_t(300 * 300 * 3), 0xAB);
  for (int k = 0; k < 60; ++k) {
    const int64_t h = std::uniform_int_distribution<int64_t>(1, 700)(gen);
    const int64_t w = std::uniform_int_distribution<int64_t>(1, 700)(gen);
    const int64_t size = std::uniform_int_distribution<int64_t>(1, 256)(gen);
    const Image src = random_image(h, w, gen, k % 2 == 0);
    CropBox box{0, 0, h, w, k % 3 == 0};
    box.h = std::uniform_int_distribution<int64_t>(1, h)(gen);
    box.w = std::uniform_int_distribution<int64_t>(1, w)(gen);
    box.y = std::uniform_int_distribution<int64_t>(0, h - box.h)(gen);
    box.x = std::uniform_int_distribution<int64_t>(0, w - box.w)(gen);
    const Interpolation f = k % 4 < 2 ? Interpolation::bilinear : Interpolation::bicubic;
    Image want;
    resample_u8(src, box, size, f, want);
    resample_u8(src, box, size, f, got, scratch);
    ASSERT_EQ(got.pixels, want.pixels)
        << "image " << k << ": " << h << "x" << w << " crop " << box.h << "x" << box.w << " -> " << size;
  }
}

TEST(ResizeKernels, TheDefaultIsTheWidestThisCpuRuns) {
  ::unsetenv("CZ_RESIZE_KERNEL");
  const ResizeKernel k = default_resize_kernel();
  EXPECT_TRUE(resize_kernel_runs_here(k));
  for (ResizeKernel wider : {ResizeKernel::avx2, ResizeKernel::avx512})
    if (resize_kernel_runs_here(wider)) {
      EXPECT_GE(int(k), int(wider)) << resize_kernel_name(wider);
    }
}

TEST(ResizeKernels, EnvironmentNamesTheKernelOrIsRefused) {
  ::setenv("CZ_RESIZE_KERNEL", "scalar", 1);
  EXPECT_EQ(default_resize_kernel(), ResizeKernel::scalar);
  ::setenv("CZ_RESIZE_KERNEL", "sse9", 1);
  try {
    default_resize_kernel();
    ADD_FAILURE() << "an unknown kernel name was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("CZ_RESIZE_KERNEL"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sse9"), std::string::npos) << e.what();
  }
  for (ResizeKernel k : kVectorKernels)
    if (!resize_kernel_runs_here(k)) {
      ::setenv("CZ_RESIZE_KERNEL", resize_kernel_name(k), 1);
      EXPECT_THROW(default_resize_kernel(), ValueError) << resize_kernel_name(k);
    }
  ::unsetenv("CZ_RESIZE_KERNEL");
}

}  // namespace
}  // namespace cz
