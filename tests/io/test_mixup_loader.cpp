// Mixing in the loader (Note [Mixing within a micro-batch]): each mixed batch is made of the unmixed batch's
// images as its recorded parameters say; W ranks' batches equal one rank's with W times as many smaller
// batches (the --grad-accum equivalence) whatever the thread count; and the picture --dump-batches FILE.png
// writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/data/batch_dump.h"
#include "io/data/loader.h"
#include "io/decode/image_codec.h"
#include "io_testing.h"

namespace cz {
namespace {

std::shared_ptr<const Dataset> synthetic() {
  return open_dataset("synthetic:n=96,classes=5,size=12", Split::train, {});
}

LoaderOptions options(int world, int rank, int64_t per_rank, MixMode mode) {
  LoaderOptions o = testing::loader_options(per_rank * world, 12);
  o.augment = true;
  o.seed = 11;
  o.world = world;
  o.rank = rank;
  o.threads = 2;
  o.mix.mixup_alpha = 0.8;
  o.mix.cutmix_alpha = 1.0;
  o.mix.mode = mode;
  o.mix.label_smoothing = 0.1;
  o.mix.num_classes = 5;
  return o;
}

std::vector<Batch> epoch_batches(LoaderOptions o, int64_t epoch = 1) {
  Loader l(synthetic(), o);
  l.start_epoch(epoch);
  std::vector<Batch> out;
  while (auto b = l.next()) out.push_back(std::move(*b));
  return out;
}

using testing::same_bits;

// Every pixel of every mixed batch is the unmixed batch's, combined as the batch's MixParams record: inside a
// CutMix box the partner's pixel, else f32(own * f32(lam)) + f32(partner * f32(1 - lam)) (batch mode).
TEST(MixupLoader, MixedBatchesAreTheUnmixedOnesCombinedAsRecorded) {
  LoaderOptions plain = options(1, 0, 8, MixMode::batch);
  plain.mix = MixConfig{};
  const std::vector<Batch> mixed = epoch_batches(options(1, 0, 8, MixMode::batch));
  const std::vector<Batch> unmixed = epoch_batches(plain);
  ASSERT_EQ(mixed.size(), unmixed.size());
  int cut_batches = 0, mix_batches = 0;
  for (size_t b = 0; b < mixed.size(); ++b) {
    ASSERT_TRUE(mixed[b].targets.defined());
    EXPECT_FALSE(unmixed[b].targets.defined());
    EXPECT_EQ(mixed[b].sources, unmixed[b].sources);
    const std::vector<float> x = unmixed[b].images.to_vector<float>(), y = mixed[b].images.to_vector<float>();
    const int64_t n = 8, px = 12 * 12 * 3;
    for (int64_t i = 0; i < n; ++i) {
      const SampleMix& s = mixed[b].mix.samples[size_t(i)];
      ASSERT_EQ(s.partner, n - 1 - i);
      const float l = float(s.lam), m = float(1.0 - s.lam);
      for (int64_t k = 0; k < px; ++k) {
        const int64_t row = k / (12 * 3), col = k / 3 % 12;
        const bool in_box =
            s.cutmix && row >= s.box.y0 && row < s.box.y1 && col >= s.box.x0 && col < s.box.x1;
        float want = x[size_t(i * px + k)];
        if (in_box) {
          want = x[size_t(s.partner * px + k)];
        } else if (!s.cutmix && s.lam != 1.0) {
          const float a = x[size_t(i * px + k)] * l, c = x[size_t(s.partner * px + k)] * m;
          want = a + c;
        }
        ASSERT_EQ(y[size_t(i * px + k)], want) << "batch " << b << " image " << i << " element " << k;
      }
    }
    cut_batches += mixed[b].mix.samples[0].cutmix;
    mix_batches += !mixed[b].mix.samples[0].cutmix && mixed[b].mix.samples[0].lam != 1.0;
  }
  EXPECT_GT(cut_batches, 0);  // 12 batches, switch probability 1/2
  EXPECT_GT(mix_batches, 0);
}

// Note [Mixing within a micro-batch]: rank r of W with micro-batch m receives exactly what one rank with
// micro-batch m receives as its micro-batch W b + r, images, targets and mixing alike, at any thread count.
TEST(MixupLoader, RanksEqualOneRankWithAccumulationAtAnyThreadCount) {
  for (MixMode mode : {MixMode::batch, MixMode::pair, MixMode::elem}) {
    SCOPED_TRACE(mix_mode_name(mode));
    const std::vector<Batch> one = epoch_batches(options(1, 0, 4, mode));
    for (int world : {2, 4}) {
      for (int rank = 0; rank < world; ++rank) {
        LoaderOptions o = options(world, rank, 4, mode);
        o.threads = rank % 2 == 0 ? 0 : 3;
        const std::vector<Batch> mine = epoch_batches(o);
        ASSERT_EQ(mine.size() * size_t(world), one.size());
        for (size_t b = 0; b < mine.size(); ++b) {
          const Batch& ref = one[b * size_t(world) + size_t(rank)];
          EXPECT_EQ(mine[b].first_sample, ref.first_sample);
          EXPECT_EQ(mine[b].sources, ref.sources);
          EXPECT_TRUE(same_bits(mine[b].images, ref.images)) << "world " << world << " rank " << rank;
          EXPECT_TRUE(same_bits(mine[b].targets, ref.targets)) << "world " << world << " rank " << rank;
          for (size_t i = 0; i < 4; ++i) EXPECT_EQ(mine[b].mix.samples[i].lam, ref.mix.samples[i].lam);
        }
      }
    }
  }
}

// A resumed epoch (the loader restarted at batch k) mixes batch k as the uninterrupted epoch did.
TEST(MixupLoader, ARestartedEpochMixesAsTheUninterruptedOne) {
  const std::vector<Batch> whole = epoch_batches(options(1, 0, 8, MixMode::elem));
  Loader l(synthetic(), options(1, 0, 8, MixMode::elem));
  l.start_epoch(1, 5);
  for (size_t b = 5; b < whole.size(); ++b) {
    const std::optional<Batch> got = l.next();
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(same_bits(got->images, whole[b].images)) << b;
    EXPECT_TRUE(same_bits(got->targets, whole[b].targets)) << b;
  }
}

TEST(MixupLoader, AnOddBatchPerRankIsRefused) {
  try {
    Loader l(synthetic(), options(2, 0, 3, MixMode::batch));
    ADD_FAILURE() << "an odd batch per rank was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("even"), std::string::npos) << e.what();
  }
}

// The picture: one cell per image, un-normalised pixels within one level of the batch's, text below.
TEST(BatchDumpPng, ShowsTheImagesUnnormalised) {
  testing::TempDir dir;
  const std::vector<Batch> batches = epoch_batches(options(1, 0, 6, MixMode::batch));
  const Batch& b = batches[0];
  const std::string path = dir.str("first.png");
  write_batch_png(path, b.images, b.labels, b.targets);
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  Image img;
  decode_image(bytes.data(), bytes.size(), path, img);
  // 6 images: 3 columns x 2 rows of cells of 12 + 2 pixels across and 12 + 2 lines of 6 + 2 x 2 down.
  EXPECT_EQ(img.width, 3 * 14 + 2);
  EXPECT_EQ(img.height, 2 * (12 + 12 + 4) + 2);
  const std::vector<float> x = b.images.to_vector<float>();
  int worst = 0;
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t y = 0; y < 12; ++y)
      for (int64_t xx = 0; xx < 12; ++xx)
        for (int c = 0; c < 3; ++c) {
          const double v = x[size_t(((i * 12 + y) * 12 + xx) * 3 + c)] * kImageNetStd[c] + kImageNetMean[c];
          const int want = int(std::lround(std::clamp(v, 0.0, 1.0) * 255));
          const int64_t py = 2 + (i / 3) * 28 + y, pxl = 2 + (i % 3) * 14 + xx;
          worst = std::max(worst, std::abs(int(img.pixels[size_t((py * img.width + pxl) * 3 + c)]) - want));
        }
  EXPECT_LE(worst,
            1);  // the writer may fuse v * std + mean, this test does not: one level at a rounding edge
  // Some text was drawn in the strip under the first image.
  int lit = 0;
  for (int64_t y = 2 + 12; y < 28; ++y)
    for (int64_t xx = 2; xx < 14; ++xx) lit += img.pixels[size_t((y * img.width + xx) * 3)] == 255;
  EXPECT_GT(lit, 5);
}

}  // namespace
}  // namespace cz
