// The loader as a stream across epochs (Note [Running ahead] in loader.h): its workers run into the next
// epoch before the last batches of this one are taken, what they make is what a loader restarted per epoch
// makes, bit for bit, at any thread count and from any start; one pass stays one pass; errors reach the
// consumer and stopping with workers ahead is prompt.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "io/data/loader.h"
#include "io_testing.h"

namespace cz {
namespace {

using Clock = std::chrono::steady_clock;
using testing::same_bits;

// Example i is a 6x5 image whose pixels encode i, label i % 7; it counts its reads, can be slowed, and fails
// at `fail_at`.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t n, int64_t fail_at = -1, int sleep_ms = 0)
      : n_(n), fail_at_(fail_at), sleep_ms_(sleep_ms) {}
  int64_t size() const override { return n_; }
  int64_t num_classes() const override { return 7; }
  int64_t label(int64_t index) const override { return index % 7; }
  std::string describe() const override { return "counting"; }
  void read(int64_t index, Image& out) const override {
    reads_.fetch_add(1);
    if (sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    if (index == fail_at_) throw IoError(fmt::format("counting.bin: example {} is corrupt", index));
    testing::index_image(index, out);
  }
  int64_t reads() const { return reads_.load(); }

 private:
  int64_t n_, fail_at_;
  int sleep_ms_;
  mutable std::atomic<int64_t> reads_{0};
};

// Waits up to 20 s for `cond`; true when it held.
template <class F>
bool eventually(F cond) {
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return cond();
}

// The whole recipe on synthetic images: crop and flip, RandAugment, erasing, Mixup/CutMix, normalised.
LoaderOptions recipe(int threads) {
  LoaderOptions o = testing::loader_options(8, 16);
  o.seed = 21;
  o.threads = threads;
  testing::with_recipe(o, 0.5, 5);
  o.mix.label_smoothing = 0.1;
  return o;
}

std::shared_ptr<const Dataset> synthetic() {
  // 44 images in batches of 8: 5 batches an epoch, 4 images dropped.
  return open_dataset("synthetic:n=44,classes=5,size=20", Split::train, {});
}

void expect_same(const Batch& a, const Batch& b, const std::string& where) {
  EXPECT_EQ(a.epoch, b.epoch) << where;
  EXPECT_EQ(a.index, b.index) << where;
  EXPECT_EQ(a.first_sample, b.first_sample) << where;
  EXPECT_EQ(a.sources, b.sources) << where;
  EXPECT_TRUE(same_bits(a.pixels, b.pixels)) << where;
  EXPECT_TRUE(same_bits(a.images, b.images)) << where;
  EXPECT_TRUE(same_bits(a.labels, b.labels)) << where;
  EXPECT_TRUE(same_bits(a.targets, b.targets)) << where;
  ASSERT_EQ(a.erased.size(), b.erased.size()) << where;
  for (size_t i = 0; i < a.erased.size(); ++i) {
    ASSERT_EQ(a.erased[i].size(), b.erased[i].size()) << where;
    for (size_t k = 0; k < a.erased[i].size(); ++k) EXPECT_EQ(a.erased[i][k].values, b.erased[i][k].values);
  }
  ASSERT_EQ(a.mix.samples.size(), b.mix.samples.size()) << where;
  for (size_t i = 0; i < a.mix.samples.size(); ++i) EXPECT_EQ(a.mix.samples[i].lam, b.mix.samples[i].lam);
}

TEST(LoaderStream, FirstBatchOfTheNextEpochIsMadeBeforeThisEpochsLastIsTaken) {
  for (int threads : {1, 2, 3}) {
    auto data = std::make_shared<CountingDataset>(16);  // 4 batches of 4 an epoch
    LoaderOptions o = testing::loader_options(4, 4);
    o.threads = threads;
    o.prefetch = 2;  // a window of 2 x threads batches: epoch 1's first is in it once 3 are taken
    o.endless = true;
    Loader loader(data, o);
    for (int b = 0; b < 3; ++b) ASSERT_EQ(loader.next()->index, b);
    // Epoch 0's last batch (3) is not taken: epoch 1's first batch (4 reads more) is made all the same.
    EXPECT_TRUE(eventually([&] { return data->reads() >= 20; }))
        << threads << " thread(s): " << data->reads() << " reads, epoch 1 not begun";
    const std::optional<Batch> last = loader.next(), first = loader.next();
    ASSERT_TRUE(last && first);
    EXPECT_EQ(last->epoch, 0);
    EXPECT_EQ(last->index, 3);
    EXPECT_EQ(first->epoch, 1);
    EXPECT_EQ(first->index, 0);
    const std::vector<int64_t> order = loader.epoch_order(1);
    EXPECT_EQ(first->sources, std::vector<int64_t>(order.begin(), order.begin() + 4));
  }
}

TEST(LoaderStream, OnePassReadsNoFurtherThanItsEpoch) {
  auto data = std::make_shared<CountingDataset>(16);
  LoaderOptions o = testing::loader_options(4, 4);
  o.threads = 3;
  Loader loader(data, o);  // not endless: evaluation's loader
  int64_t batches = 0;
  while (loader.next()) ++batches;
  EXPECT_EQ(batches, 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(data->reads(), 16) << "a one-pass loader read past its epoch";
  EXPECT_FALSE(loader.next().has_value());
}

// Three epochs as one stream against three loaders started per epoch, and against streams started mid-epoch
// and at an epoch's end (first_batch = steps: a checkpoint saved after an epoch's last batch).
TEST(LoaderStream, BatchesAcrossEpochsAreThoseOfALoaderRestartedPerEpoch) {
  std::vector<Batch> restarted;
  for (int64_t e = 0; e < 3; ++e) {
    Loader l(synthetic(), recipe(2));
    l.start_epoch(e);
    while (auto b = l.next()) restarted.push_back(std::move(*b));
  }
  ASSERT_EQ(restarted.size(), 15u);
  for (int threads : {0, 1, 3}) {
    LoaderOptions o = recipe(threads);
    o.endless = true;
    o.prefetch = 1;
    Loader stream(synthetic(), o);
    for (size_t i = 0; i < restarted.size(); ++i) {
      const std::optional<Batch> b = stream.next();
      ASSERT_TRUE(b.has_value());
      expect_same(*b, restarted[i], fmt::format("{} thread(s), batch {} of the stream", threads, i));
    }
    for (const auto& [epoch, first] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {0, 5}, {1, 4}, {1, 5}}) {
      stream.start_epoch(epoch, first);
      for (size_t i = size_t(epoch * 5 + first); i < restarted.size(); ++i)
        expect_same(*stream.next(), restarted[i],
                    fmt::format("{} thread(s), started at ({}, {}), batch {}", threads, epoch, first, i));
    }
  }
}

// Note [Resuming at another global batch]: 2 ranks x 4 stop 16 positions into an epoch of 30; 3 ranks x 2
// (B' = 6, 16 not a multiple) and 1 rank x 5 continue from there. Each position of the epoch is read once,
// augmented as one batch of the whole epoch augments it; with drop_last the last (30 - 16) mod B' are
// dropped, without it the last batch is partial. The next epoch is whole.
TEST(LoaderStream, ResumingAtAnotherGlobalBatchReadsEachPositionOnce) {
  auto data = std::make_shared<CountingDataset>(30);
  LoaderOptions base;
  base.image_size = 4;
  base.augment = true;
  base.seed = 5;
  base.threads = 2;
  base.endless = true;
  LoaderOptions whole = base;  // every position of epoch 0 in one batch
  whole.batch_size = 30;
  whole.drop_last = false;
  whole.endless = false;
  const Batch all = *Loader(data, whole).next();
  const int64_t px = 4 * 4 * 3;
  for (bool drop_last : {true, false}) {
    std::vector<int> seen(30, 0);
    auto take = [&](const Batch& b, const std::string& what) {
      for (int64_t i = 0; i < b.labels.numel(); ++i) {
        const int64_t pos = b.first_sample + i;
        ++seen[size_t(pos)];
        EXPECT_EQ(b.sources[size_t(i)], all.sources[size_t(pos)]) << what << ", position " << pos;
        EXPECT_EQ(0, std::memcmp(b.pixels.data<uint8_t>() + i * px, all.pixels.data<uint8_t>() + pos * px,
                                 size_t(px)))
            << what << ", position " << pos << ": augmented otherwise";
      }
    };
    int64_t stopped = 0;
    for (int rank = 0; rank < 2; ++rank) {
      LoaderOptions o = base;
      o.batch_size = 8;
      o.world = 2;
      o.rank = rank;
      o.drop_last = drop_last;
      Loader first(data, o);
      for (int b = 0; b < 2; ++b) {
        const Batch batch = *first.next();
        take(batch, "before the stop");
        stopped = batch.next_position;
      }
    }
    ASSERT_EQ(stopped, 16);
    for (const auto& [world, micro] : std::vector<std::pair<int, int64_t>>{{3, 2}, {1, 5}}) {
      const std::vector<int> before = seen;
      const int64_t batch = world * micro;
      const int64_t steps = drop_last ? (30 - 16) / batch : (30 - 16 + batch - 1) / batch;
      for (int rank = 0; rank < world; ++rank) {
        LoaderOptions o = base;
        o.batch_size = batch;
        o.world = world;
        o.rank = rank;
        o.drop_last = drop_last;
        Loader loader(data, o);
        loader.start_at(0, stopped);
        for (int64_t b = 0; b < steps; ++b) {
          const Batch got = *loader.next();
          ASSERT_EQ(got.epoch, 0);
          EXPECT_EQ(got.next_position, std::min<int64_t>(16 + (b + 1) * batch, 30));
          take(got, fmt::format("{} rank(s) x {}, rank {}, batch {}", world, micro, rank, b));
        }
        const Batch next = *loader.next();
        EXPECT_EQ(next.epoch, 1);
        EXPECT_EQ(next.index, 0);
        EXPECT_EQ(next.first_sample, rank * batch / world);
      }
      const int64_t dropped = drop_last ? (30 - 16) % batch : 0;
      for (int64_t pos = 0; pos < 30; ++pos)
        EXPECT_EQ(seen[size_t(pos)], pos < 30 - dropped ? 1 : 0)
            << "position " << pos << ", resumed on " << world << " rank(s) x " << micro
            << (drop_last ? ", drop_last" : "");
      seen = before;
    }
  }
}

TEST(LoaderStream, WorkerErrorReachesTheConsumerInItsPlace) {
  for (int threads : {0, 1, 3}) {
    LoaderOptions o = testing::in_order(4, 4);
    o.threads = threads;
    o.endless = true;
    Loader loader(std::make_shared<CountingDataset>(16, 9), o);
    for (int b = 0; b < 2; ++b) ASSERT_TRUE(loader.next().has_value());
    // Batch 2 holds the corrupt example 9.
    ASSERT_NO_FATAL_FAILURE(
        testing::expect_batch_error(loader, "counting.bin: example 9", "the stream restarts"));
    loader.start_epoch(1, 3);  // batch 3 of epoch 1 (examples 12-15), then epoch 2: 9 again in its batch 2
    EXPECT_EQ(loader.next()->index, 3);
    EXPECT_EQ(loader.next()->epoch, 2);
  }
}

// Workers ahead on slow reads (50 ms an image): the destructor and a restart wait for the image in hand
// only, not for batches (32 images of work per worker in the window).
TEST(LoaderStream, StoppingWithWorkersAheadIsPrompt) {
  LoaderOptions o = testing::loader_options(16, 4);
  o.threads = 4;
  o.prefetch = 2;
  o.endless = true;
  auto data = std::make_shared<CountingDataset>(64, -1, 50);
  auto loader = std::make_unique<Loader>(data, o);
  ASSERT_TRUE(loader->next().has_value());
  ASSERT_TRUE(eventually([&] { return data->reads() > 20; }));
  auto t0 = Clock::now();
  loader->start_epoch(2);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0) << "the restart waited";
  ASSERT_TRUE(eventually([&] { return data->reads() > 40; }));
  t0 = Clock::now();
  loader.reset();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0) << "the destructor waited";
}

}  // namespace
}  // namespace cz
