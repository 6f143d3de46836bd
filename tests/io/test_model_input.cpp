// Note [Normalising on the device] (src/io/data/model_input.h): the model's input made from a batch's 8-bit
// pixels and its draws equals, bit for bit, what the loader's threads made before (normalise_u8,
// random_erase, apply_mix on the f32 batch); the element loop is the CUDA kernel's threads run one after
// another; a pixels-only loader leaves `images` for the consumer; and the bytes that travel are a quarter of
// the f32 batch's.
#include <gtest/gtest.h>

#include <cstring>

#include "io/augment/image_transform.h"
#include "io/augment/mixup.h"
#include "io/augment/random_erasing.h"
#include "io/data/loader.h"
#include "io/data/model_input.h"
#include "io_testing.h"
#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"

namespace cz {
namespace {

std::shared_ptr<const Dataset> synthetic() {
  return open_dataset("synthetic:n=64,classes=5,size=20", Split::train, {});
}

LoaderOptions recipe(EraseMode mode, int recount, MixMode mix) {
  LoaderOptions o = testing::loader_options(8, 16);
  o.augment = true;
  o.seed = 5;
  o.threads = 2;
  o.rand_augment = parse_rand_augment("rand-m9-mstd0.5-inc1");
  o.erasing = {0.6, mode, recount};
  o.mix.mixup_alpha = 0.8;
  o.mix.cutmix_alpha = 1.0;
  o.mix.mode = mix;
  o.mix.num_classes = 5;
  return o;
}

std::vector<Batch> batches_of(LoaderOptions o) {
  Loader l(synthetic(), o);
  l.start_epoch(0);
  std::vector<Batch> out;
  while (auto b = l.next()) out.push_back(std::move(*b));
  return out;
}

using testing::same_bits;

// The f32 batch as the loader made it before: each image normalised (normalise_u8) and erased in place
// (write_erasing = random_erase's writes), then the batch mixed in place (apply_mix).
Tensor former_f32_batch(const Batch& b) {
  const int64_t n = b.pixels.size(0), h = b.pixels.size(1), w = b.pixels.size(2);
  Tensor out = empty({n, h, w, 3}, DType::f32);
  for (int64_t i = 0; i < n; ++i) {
    Image img{h, w, std::vector<uint8_t>(size_t(h * w * 3))};
    std::memcpy(img.pixels.data(), b.pixels.data<uint8_t>() + i * h * w * 3, img.pixels.size());
    float* o = out.data<float>() + i * h * w * 3;
    normalise_u8(img, o);
    if (!b.erased.empty()) write_erasing(b.erased[size_t(i)], o, w);
  }
  if (!b.mix.samples.empty()) apply_mix(b.mix, out);
  return out;
}

TEST(ModelInput, EqualsTheLoadersFormerF32BatchBitForBit) {
  int erased = 0, mixed = 0, cut = 0;
  for (EraseMode mode : {EraseMode::pixel, EraseMode::rand, EraseMode::constant})
    for (MixMode mix : {MixMode::batch, MixMode::pair, MixMode::elem})
      for (const Batch& b : batches_of(recipe(mode, 3, mix))) {
        ASSERT_TRUE(b.pixels.defined());
        ASSERT_EQ(b.pixels.dtype(), DType::u8);
        const Tensor want = former_f32_batch(b);
        EXPECT_TRUE(same_bits(model_input(b, Device::cpu()), want));
        EXPECT_TRUE(same_bits(b.images, want)) << "the loader's own images (pixels_only off)";
        for (const auto& e : b.erased) erased += e.empty() ? 0 : 1;
        for (const SampleMix& s : b.mix.samples) (s.cutmix ? cut : mixed) += s.lam != 1.0 || s.cutmix ? 1 : 0;
      }
  // The draws above did exercise erasing, blending and CutMix.
  EXPECT_GT(erased, 10);
  EXPECT_GT(mixed, 10);
  EXPECT_GT(cut, 10);
}

TEST(ModelInput, PixelsOnlyBatchesLeaveTheImagesToTheConsumer) {
  LoaderOptions o = recipe(EraseMode::pixel, 1, MixMode::pair);
  const std::vector<Batch> full = batches_of(o);
  o.pixels_only = true;
  const std::vector<Batch> lean = batches_of(o);
  ASSERT_EQ(full.size(), lean.size());
  for (size_t k = 0; k < full.size(); ++k) {
    EXPECT_FALSE(lean[k].images.defined());
    EXPECT_TRUE(same_bits(lean[k].pixels, full[k].pixels));
    EXPECT_TRUE(same_bits(model_input(lean[k], Device::cpu()), full[k].images));
    EXPECT_TRUE(same_bits(lean[k].targets, full[k].targets));
  }
}

TEST(ModelInput, ErasedBoxesOverlapInTheOrderDrawn) {
  // Two boxes over the same pixels: the later one's values win, as random_erase writes them in turn.
  Batch b;
  b.pixels = empty({1, 4, 4, 3}, DType::u8);
  std::memset(b.pixels.raw_data(), 100, 48);
  ErasePatch first{{0, 0, 3, 3}, false, {1.f, 2.f, 3.f}}, second{{1, 1, 2, 2}, false, {7.f, 8.f, 9.f}};
  b.erased = {{first, second}};
  const Tensor x = model_input(b, Device::cpu());
  const float* p = x.data<float>();
  EXPECT_EQ(p[0], 1.f);                    // (0, 0): the first box only
  EXPECT_EQ(p[(1 * 4 + 1) * 3 + 2], 9.f);  // (1, 1): both; the second's
  EXPECT_NE(p[(3 * 4 + 3) * 3], 1.f);      // (3, 3): neither, normalised
  Tensor f32 = empty({1, 4, 4, 3}, DType::f32);
  Image img{4, 4, std::vector<uint8_t>(48, 100)};
  normalise_u8(img, f32.data<float>());
  write_erasing(b.erased[0], f32.data<float>(), 4);
  EXPECT_TRUE(same_bits(x, f32));
}

TEST(ModelInput, TheDeviceGetsAQuarterOfTheF32Bytes) {
  LoaderOptions o = recipe(EraseMode::pixel, 1, MixMode::batch);
  o.erasing.probability = 0;
  o.image_size = 32;
  for (const Batch& b : batches_of(o)) {
    const int64_t f32 = b.images.nbytes(), sent = model_input_bytes(b);
    // The pixels (a quarter) plus 40 bytes of mixing parameters per image.
    EXPECT_EQ(sent, f32 / 4 + b.pixels.size(0) * int64_t(sizeof(batch_input::ImageParams)));
    EXPECT_LT(double(sent) / double(f32), 0.26);
  }
}

// Note [Copying the next batch ahead] (CUDA only: skipped without a GPU; not yet run on one): a batch copied
// ahead on the copy stream gives the same input as one copied at use, and on the CPU copy_ahead does nothing.
TEST(ModelInput, CopiedAheadEqualsCopiedAtUse) {
  LoaderOptions o = recipe(EraseMode::pixel, 1, MixMode::pair);
  o.pixels_only = true;
  std::vector<Batch> batches = batches_of(o);
  copy_ahead(batches[0], Device::cpu());
  EXPECT_FALSE(batches[0].device_pixels.defined());
  EXPECT_FALSE(batches[0].draws.pinned.defined());
  if (cuda_runtime::device_count() == 0) GTEST_SKIP() << "no GPU: the copy ahead is CUDA's";
  const Device gpu = Device::cuda(0);
  o.pinned = true;
  std::vector<Batch> pinned = batches_of(o);
  for (Batch& b : pinned) {
    const Tensor at_use = model_input(b, gpu).cpu();
    copy_ahead(b, gpu);
    ASSERT_TRUE(b.device_pixels.defined());
    ASSERT_TRUE(b.draws.pinned.defined());  // packed ahead, read by the kernel in place
    const Tensor ahead = model_input(b, gpu).cpu();
    EXPECT_TRUE(same_bits(ahead, at_use));
    EXPECT_TRUE(same_bits(ahead, model_input(b, Device::cpu())));
  }
}

}  // namespace
}  // namespace cz
