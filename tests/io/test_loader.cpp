// The sampler and loader: Note [Sampling] (permutations, rank split, uneven final batch), augmentation that
// does not depend on world size or thread count, normalisation, resizing, and worker errors.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "io/augment/image_transform.h"
#include "io/data/loader.h"
#include "io/data/sampler.h"
#include "io_testing.h"

namespace cz {
namespace {

// Example i is a 6x5 image whose pixels encode i; its label is i, so batches reveal which examples they hold.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t fail_at = -1) : n_(n), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  int64_t num_classes() const override { return n_; }
  int64_t label(int64_t index) const override { return index; }
  std::string describe() const override { return "index"; }
  void read(int64_t index, Image& out) const override {
    if (index == fail_at_) throw IoError(fmt::format("index.bin: example {} is corrupt", index));
    testing::index_image(index, out);
  }

 private:
  int64_t n_, fail_at_;
};

std::vector<int64_t> labels_of(const Batch& b) {
  return b.labels.to_vector<int64_t>();
}

// Every batch of one epoch for one rank.
std::vector<Batch> epoch_batches(std::shared_ptr<const Dataset> data, LoaderOptions opt, int64_t epoch = 0) {
  Loader loader(std::move(data), opt);
  loader.start_epoch(epoch);
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

TEST(Sampler, PermutationsAreDeterministicPerSeedAndEpoch) {
  auto data = std::make_shared<IndexDataset>(100);
  LoaderOptions opt;
  opt.seed = 5;
  Loader a(data, opt), b(data, opt);
  const auto e0 = a.epoch_order(0);
  EXPECT_EQ(e0, b.epoch_order(0));
  EXPECT_NE(e0, a.epoch_order(1));
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 100u);
  EXPECT_EQ(*std::max_element(e0.begin(), e0.end()), 99);
  opt.seed = 6;
  EXPECT_NE(e0, Loader(data, opt).epoch_order(0));
  opt.shuffle = false;
  const auto plain = Loader(data, opt).epoch_order(3);
  for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(plain[size_t(i)], i);
}

TEST(Sampler, ShuffleOffReadsFileOrder) {
  LoaderOptions opt = testing::in_order(8, 4);
  const auto batches = epoch_batches(std::make_shared<IndexDataset>(30), opt);
  ASSERT_EQ(batches.size(), 3u);  // drop_last: 30 / 8
  int64_t expect = 0;
  for (const Batch& b : batches)
    for (int64_t l : labels_of(b)) EXPECT_EQ(l, expect++);
}

TEST(Sampler, ShuffledBatchesFollowTheEpochOrder) {
  auto data = std::make_shared<IndexDataset>(40);
  LoaderOptions opt = testing::loader_options(10, 4);
  opt.seed = 11;
  const auto order = Loader(data, opt).epoch_order(2);
  const auto batches = epoch_batches(data, opt, 2);
  std::vector<int64_t> seen;
  for (const Batch& b : batches) {
    EXPECT_EQ(b.first_sample, b.index * 10);
    for (int64_t l : labels_of(b)) seen.push_back(l);
  }
  EXPECT_EQ(seen, order);
}

// W ranks with micro-batch m, concatenated in rank order, are exactly one rank with batch W*m: the same
// examples in the same places, the same augmented pixels, whatever the worker thread count.
TEST(Sampler, RanksTogetherEqualOneRankAugmentedAndAnyThreadCount) {
  auto data = open_dataset("synthetic:n=45,classes=3,size=20", Split::train, {});
  LoaderOptions base;
  base.image_size = 12;
  base.augment = true;
  base.seed = 9;
  base.drop_last = false;
  for (int world : {2, 3}) {
    const int64_t micro = 4;
    LoaderOptions one = base;
    one.batch_size = world * micro;
    one.threads = 1;
    const auto whole = epoch_batches(data, one, 1);
    std::vector<std::vector<Batch>> parts;
    for (int r = 0; r < world; ++r) {
      LoaderOptions opt = one;
      opt.world = world;
      opt.rank = r;
      opt.threads = r % 2 == 0 ? 0 : 3;
      opt.prefetch = 1 + r;
      parts.push_back(epoch_batches(data, opt, 1));
      ASSERT_EQ(parts.back().size(), whole.size());
    }
    for (size_t b = 0; b < whole.size(); ++b) {
      std::vector<int64_t> labels;
      std::vector<float> pixels;
      for (int r = 0; r < world; ++r) {
        const Batch& p = parts[size_t(r)][b];
        EXPECT_EQ(p.index, int64_t(b));
        const auto l = labels_of(p);
        labels.insert(labels.end(), l.begin(), l.end());
        const auto px = p.images.to_vector<float>();
        pixels.insert(pixels.end(), px.begin(), px.end());
      }
      EXPECT_EQ(labels, labels_of(whole[b])) << "world " << world << " batch " << b;
      EXPECT_EQ(pixels, whole[b].images.to_vector<float>()) << "world " << world << " batch " << b;
    }
  }
}

TEST(Sampler, FinalPartialBatchIsSplitEvenlyAndContiguously) {
  auto data = std::make_shared<IndexDataset>(10);
  LoaderOptions opt = testing::in_order(4, 3);
  opt.drop_last = false;
  opt.world = 3;
  std::vector<int64_t> all;
  // Batches 0 and 1 hold 4 examples (split 1, 1, 2); the last holds 2 (split 0, 1, 1).
  const int64_t expect_sizes[3][3] = {{1, 1, 0}, {1, 1, 1}, {2, 2, 1}};
  std::vector<std::vector<Batch>> per_rank;
  for (int r = 0; r < 3; ++r) {
    opt.rank = r;
    per_rank.push_back(epoch_batches(data, opt));
    ASSERT_EQ(per_rank.back().size(), 3u);
    for (size_t b = 0; b < 3; ++b) {
      const Batch& batch = per_rank.back()[b];
      EXPECT_EQ(batch.labels.numel(), expect_sizes[r][b]) << "rank " << r << " batch " << b;
      EXPECT_EQ(batch.images.sizes(), (Shape{expect_sizes[r][b], 3, 3, 3}));
    }
  }
  for (size_t b = 0; b < 3; ++b)
    for (int r = 0; r < 3; ++r) {
      const auto l = labels_of(per_rank[size_t(r)][b]);
      if (!l.empty()) {
        EXPECT_EQ(per_rank[size_t(r)][b].first_sample, l[0]);
      }
      all.insert(all.end(), l.begin(), l.end());
    }
  for (int64_t i = 0; i < 10; ++i) ASSERT_EQ(all[size_t(i)], i);
  opt.drop_last = true;
  EXPECT_EQ(Loader(data, opt).steps_per_epoch(), 2);
}

TEST(Sampler, RankSliceArithmetic) {
  EXPECT_EQ(batches_per_epoch(10, 4, true), 2);
  EXPECT_EQ(batches_per_epoch(10, 4, false), 3);
  const BatchSlice s = rank_slice(10, 4, 2, 4, 3);
  EXPECT_EQ(s.begin, 9);
  EXPECT_EQ(s.end, 10);
}

TEST(Transform, NormalisesWithImageNetStatistics) {
  Image img{3, 2, {}};
  for (int p = 0; p < 6; ++p) img.pixels.insert(img.pixels.end(), {255, 0, 128});
  std::vector<float> out(4 * 4 * 3);
  resample_normalised(img, CropBox{0, 0, 3, 2}, 4, out.data());
  const float v[3] = {255, 0, 128};
  for (size_t i = 0; i < out.size(); ++i) {
    const int c = int(i % 3);
    EXPECT_NEAR(out[i], (v[c] / 255.0f - kImageNetMean[c]) / kImageNetStd[c], 1e-5) << i;
  }
  EXPECT_NEAR((1.0f - kImageNetMean[0]) / kImageNetStd[0], 2.2489f, 1e-4);
}

// Pixel values back from normalised floats (channel c).
float unnormalise(float v, int c) {
  return (v * kImageNetStd[c] + kImageNetMean[c]) * 255.0f;
}

TEST(Transform, ResizeIsCentredIdentityAndFlips) {
  Image ramp{4, 20, {}};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 20; ++x) ramp.pixels.insert(ramp.pixels.end(), {uint8_t(10 * x), 7, 7});
  // Identity size: exact copy.
  std::vector<float> same(4 * 4 * 3);
  Image square{4, 4, {}};
  for (int i = 0; i < 16; ++i)
    square.pixels.insert(square.pixels.end(), {uint8_t(i * 9), uint8_t(200 - i), 3});
  resample_normalised(square, CropBox{0, 0, 4, 4}, 4, same.data());
  for (size_t i = 0; i < same.size(); ++i)
    EXPECT_NEAR(unnormalise(same[i], int(i % 3)), square.pixels[i], 1e-3);
  // Halving a ramp: symmetric taps keep each output at its centre's value, 10 * (2o + 0.5).
  std::vector<float> half(10 * 10 * 3), flipped(10 * 10 * 3);
  resample_normalised(ramp, CropBox{0, 0, 4, 20}, 10, half.data());
  for (int o = 1; o < 9; ++o) EXPECT_NEAR(unnormalise(half[size_t(o * 3)], 0), 10 * (2 * o + 0.5), 1e-2) << o;
  CropBox box{0, 0, 4, 20};
  box.flip = true;
  resample_normalised(ramp, box, 10, flipped.data());
  for (int y = 0; y < 10; ++y)
    for (int x = 0; x < 10; ++x)
      EXPECT_FLOAT_EQ(flipped[size_t((y * 10 + x) * 3)], half[size_t((y * 10 + 9 - x) * 3)]);
}

TEST(Transform, RandomResizedCropStaysInsideAndVaries) {
  int flips = 0;
  std::set<std::pair<int64_t, int64_t>> sizes;
  for (auto [h, w] : {std::pair<int64_t, int64_t>{32, 32}, {7, 300}, {300, 7}, {1, 1}, {50, 20}}) {
    for (uint64_t pos = 0; pos < 200; ++pos) {
      CounterRng rng(42, pos << 6);
      const CropBox b = random_resized_crop(h, w, rng);
      ASSERT_GE(b.y, 0);
      ASSERT_GE(b.x, 0);
      ASSERT_GE(b.h, 1);
      ASSERT_GE(b.w, 1);
      ASSERT_LE(b.y + b.h, h);
      ASSERT_LE(b.x + b.w, w);
      flips += b.flip;
      if (h == 32) sizes.insert({b.h, b.w});
    }
  }
  EXPECT_GT(flips, 350);
  EXPECT_LT(flips, 650);
  EXPECT_GT(sizes.size(), 50u);
}

TEST(Loader, AugmentationVariesWithEpochAndDiffersFromPlainResize) {
  auto data = open_dataset("synthetic:n=8,classes=2,size=16", Split::train, {});
  LoaderOptions opt = testing::in_order(8, 16);
  const auto plain = epoch_batches(data, opt)[0].images.to_vector<float>();
  opt.augment = true;
  const auto e0 = epoch_batches(data, opt, 0)[0].images.to_vector<float>();
  const auto e0_again = epoch_batches(data, opt, 0)[0].images.to_vector<float>();
  const auto e1 = epoch_batches(data, opt, 1)[0].images.to_vector<float>();
  EXPECT_EQ(e0, e0_again);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, plain);
  // Without augmentation at the stored size the loader reproduces the pixels exactly.
  Image img;
  data->read(3, img);
  for (size_t i = 0; i < img.pixels.size(); ++i)
    ASSERT_NEAR(unnormalise(plain[3 * 16 * 16 * 3 + i], int(i % 3)), img.pixels[i], 1e-3);
}

TEST(Loader, WorkerErrorIsRethrownOnTheConsumer) {
  for (int threads : {0, 1, 3}) {
    LoaderOptions opt = testing::in_order(4, 4);
    opt.threads = threads;
    Loader loader(std::make_shared<IndexDataset>(16, 9), opt);
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    ASSERT_TRUE(loader.next().has_value());
    // Batch 2 holds the corrupt example 9.
    ASSERT_NO_FATAL_FAILURE(testing::expect_batch_error(loader, "index.bin: example 9", "the next epoch"));
    // A fresh epoch starts cleanly; the loader's destructor joins workers still decoding ahead.
    loader.start_epoch(1);
    EXPECT_TRUE(loader.next().has_value());
  }
}

TEST(Loader, RestartingMidEpochBeginsTheNewEpoch) {
  LoaderOptions opt = testing::loader_options(5, 4);
  opt.threads = 2;
  opt.prefetch = 1;
  auto data = std::make_shared<IndexDataset>(50);
  Loader loader(data, opt);
  loader.start_epoch(0);
  loader.next();
  loader.next();
  loader.start_epoch(1);
  std::vector<int64_t> seen;
  int64_t batches = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(b->index, batches++);
    const auto l = labels_of(*b);
    seen.insert(seen.end(), l.begin(), l.end());
  }
  EXPECT_EQ(batches, 10);
  EXPECT_EQ(seen, loader.epoch_order(1));
  EXPECT_FALSE(loader.next().has_value());
}

}  // namespace
}  // namespace cz
