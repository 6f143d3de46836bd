// Mixup and CutMix (io/augment/mixup.h): our pixels and targets against timm's own for the same lam, boxes
// and pairing (tests/data/mixup_fixture.h5, made by tools/make_mixup_fixture.py), and our draws' statistics
// against timm's distributions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "io/augment/mixup.h"
#include "io/data/sampler.h"
#include "io/h5/h5_file.h"

namespace cz {
namespace {

std::string fixture() {
  return std::string(CZ_TEST_DATA_DIR) + "/mixup_fixture.h5";
}

// Elements that differ in their bits, and the largest difference.
struct BitDiff {
  int64_t differing = 0;
  double largest = 0;
};
BitDiff bit_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  EXPECT_EQ(x.size(), y.size());
  BitDiff d;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) {
      ++d.differing;
      d.largest = std::max(d.largest, std::abs(double(x[i]) - double(y[i])));
    }
  return d;
}

// Every case of the fixture: timm's lam, CutMix decisions and boxes with timm's pairing (n-1-i) into our
// apply_mix and mix_targets give timm's images and targets bit for bit.
TEST(MixupTimm, ImagesAndTargetsEqualTimmsBitForBit) {
  const h5::File f = h5::File::open(fixture());
  const char* cases[] = {"batch_mixup", "batch_cutmix", "batch_minmax", "batch_switch",
                         "batch_off",   "pair",         "elem",         "elem_minmax"};
  for (const char* name : cases) {
    SCOPED_TRACE(name);
    const std::string g = std::string(name) + "/";
    Tensor images = f.read(g + "images");
    const Tensor labels = f.read(g + "labels");
    const std::vector<double> lams = f.read(g + "lams").to_vector<double>();
    const std::vector<int64_t> cut = f.read(g + "cutmix").to_vector<int64_t>();
    const std::vector<int64_t> boxes = f.read(g + "boxes").to_vector<int64_t>();
    const int64_t n = images.size(0), k = int64_t(f.read(g + "num_classes").item());
    MixParams p;
    p.mode = MixMode(int64_t(f.read(g + "mode").item()));
    for (int64_t i = 0; i < n; ++i) {
      SampleMix s;
      s.partner = n - 1 - i;
      s.lam = lams[size_t(i)];
      s.cutmix = cut[size_t(i)] != 0;
      s.box = {boxes[size_t(4 * i)], boxes[size_t(4 * i + 1)], boxes[size_t(4 * i + 2)],
               boxes[size_t(4 * i + 3)]};
      p.samples.push_back(s);
    }
    const Tensor before = images.clone();
    apply_mix(p, images);
    const BitDiff di = bit_diff(images, f.read(g + "mixed"));
    EXPECT_EQ(di.differing, 0) << "largest difference " << di.largest;
    const Tensor targets = mix_targets(p, labels, k, f.read(g + "smoothing").item());
    const BitDiff dt = bit_diff(targets, f.read(g + "targets"));
    EXPECT_EQ(dt.differing, 0) << "largest difference " << dt.largest;
    // The case mixes something (or, for batch_off, nothing).
    EXPECT_EQ(bit_diff(images, before).differing == 0, std::string(name) == "batch_off");
  }
}

MixConfig config(double mixup, double cutmix, MixMode mode = MixMode::batch) {
  MixConfig c;
  c.mixup_alpha = mixup;
  c.cutmix_alpha = cutmix;
  c.mode = mode;
  c.num_classes = 10;
  return c;
}

// The draw is a function of (seed, epoch, first position) alone; any of them changes it.
TEST(MixupDraw, IsKeyedBySeedEpochAndPosition) {
  const MixConfig c = config(0.8, 1.0, MixMode::elem);
  auto draw = [&](uint64_t seed, int64_t epoch, int64_t pos) {
    CounterRng rng = mix_stream(seed, epoch, pos);
    std::vector<double> v;
    for (const SampleMix& s : draw_mix(c, 16, 32, 32, rng).samples) {
      v.push_back(s.lam);
      v.push_back(double(s.box.y0 * 1000 + s.box.x1));
    }
    return v;
  };
  EXPECT_EQ(draw(3, 1, 64), draw(3, 1, 64));
  EXPECT_NE(draw(3, 1, 64), draw(4, 1, 64));
  EXPECT_NE(draw(3, 1, 64), draw(3, 2, 64));
  EXPECT_NE(draw(3, 1, 64), draw(3, 1, 80));
}

// Many batch-mode draws: lam follows Beta(a, a) (mean 1/2, variance 1 / (4 (2a + 1))), the switch and the
// mixing probability are honoured, and CutMix's lam is 1 - box area / image area with the box inside the
// image.
TEST(MixupDraw, StatisticsFollowTimmsDistributions) {
  const int draws = 20000;
  for (double a : {0.2, 0.8, 1.0, 4.0}) {
    double sum = 0, sq = 0;
    for (int d = 0; d < draws; ++d) {
      CounterRng rng = mix_stream(1, 0, d * 8);
      const double lam = draw_mix(config(a, 0), 2, 8, 8, rng).samples[0].lam;
      ASSERT_TRUE(lam >= 0 && lam <= 1) << lam;
      sum += lam;
      sq += lam * lam;
    }
    const double mean = sum / draws, var = sq / draws - mean * mean, want = 1 / (4 * (2 * a + 1));
    // Standard error of the mean sqrt(var / n) <= 0.0035; of the variance about 0.002 at these sizes.
    EXPECT_NEAR(mean, 0.5, 0.015) << "alpha " << a;
    EXPECT_NEAR(var, want, 0.1 * want + 0.002) << "alpha " << a;
  }
  MixConfig c = config(0.8, 1.0);
  c.switch_prob = 0.3;
  c.prob = 0.6;
  int mixed = 0, cut = 0;
  for (int d = 0; d < draws; ++d) {
    CounterRng rng = mix_stream(2, 0, d * 8);
    const MixParams p = draw_mix(c, 4, 24, 20, rng);
    const SampleMix& s = p.samples[0];
    if (s.lam == 1.0 && !s.cutmix) continue;
    ++mixed;
    if (!s.cutmix) continue;
    ++cut;
    ASSERT_TRUE(s.box.y0 >= 0 && s.box.y0 <= s.box.y1 && s.box.y1 <= 24);
    ASSERT_TRUE(s.box.x0 >= 0 && s.box.x0 <= s.box.x1 && s.box.x1 <= 20);
    ASSERT_EQ(s.lam, 1.0 - double(s.box.area()) / (24.0 * 20.0));
    for (const SampleMix& o : p.samples) ASSERT_EQ(o.lam, s.lam);  // one draw for the batch
  }
  EXPECT_NEAR(double(mixed) / draws, 0.6, 0.02);
  EXPECT_NEAR(double(cut) / mixed, 0.3, 0.02);
}

// CutMix with min-max boxes: each side uniform over [int(S lo), int(S hi)), the box inside the image.
TEST(MixupDraw, MinMaxBoxesStayInRange) {
  MixConfig c = config(0, 0, MixMode::elem);
  c.cutmix_minmax = std::make_pair(0.25, 0.75);
  ASSERT_TRUE(c.active());
  std::vector<int> seen_h(40, 0);
  for (int d = 0; d < 2000; ++d) {
    CounterRng rng = mix_stream(5, 0, d * 4);
    for (const SampleMix& s : draw_mix(c, 4, 40, 32, rng).samples) {
      ASSERT_TRUE(s.cutmix);
      const int64_t h = s.box.y1 - s.box.y0, w = s.box.x1 - s.box.x0;
      ASSERT_TRUE(h >= 10 && h < 30 && w >= 8 && w < 24) << h << "x" << w;
      ASSERT_TRUE(s.box.y0 >= 0 && s.box.y1 <= 40 && s.box.x0 >= 0 && s.box.x1 <= 32);
      ASSERT_EQ(s.lam, double(float(1.0 - double(h * w) / (40.0 * 32.0))));
      ++seen_h[size_t(h)];
    }
  }
  for (int h = 10; h < 30; ++h) EXPECT_GT(seen_h[size_t(h)], 250) << h;  // 8000 draws over 20 sides
}

// Pair mode: image i and image n-1-i share their lam and box; elem mode: each image draws its own; lam is
// kept as a float, as timm's array is.
TEST(MixupDraw, PairsShareTheirDrawAndElementsDoNot) {
  CounterRng r1 = mix_stream(7, 0, 0);
  const MixParams pair = draw_mix(config(0.8, 1.0, MixMode::pair), 16, 16, 16, r1);
  for (int64_t i = 0; i < 16; ++i) {
    const SampleMix &s = pair.samples[size_t(i)], &t = pair.samples[size_t(15 - i)];
    EXPECT_EQ(s.partner, 15 - i);
    EXPECT_EQ(s.lam, t.lam);
    EXPECT_EQ(s.cutmix, t.cutmix);
    EXPECT_EQ(s.box.area(), t.box.area());
    EXPECT_EQ(s.lam, double(float(s.lam)));
  }
  CounterRng r2 = mix_stream(7, 0, 0);
  const MixParams elem = draw_mix(config(0.8, 1.0, MixMode::elem), 16, 16, 16, r2);
  int same = 0;
  for (int64_t i = 0; i < 8; ++i) same += elem.samples[size_t(i)].lam == elem.samples[size_t(15 - i)].lam;
  EXPECT_LT(same, 2);
}

// Targets: each row sums to 1 within f32 rounding and carries lam on the image's class and 1 - lam on its
// partner's (plus the smoothing floor).
TEST(MixupTargets, RowsSumToOneAndWeighBothClasses) {
  CounterRng rng = mix_stream(9, 0, 0);
  const MixParams p = draw_mix(config(0.8, 0, MixMode::elem), 6, 8, 8, rng);
  const Tensor labels = from_vector(std::vector<int64_t>{0, 3, 3, 9, 1, 2}, {6});
  const std::vector<float> t = mix_targets(p, labels, 10, 0.1).to_vector<float>();
  const std::vector<int64_t> y = labels.to_vector<int64_t>();
  for (int64_t i = 0; i < 6; ++i) {
    double sum = 0;
    for (int64_t k = 0; k < 10; ++k) sum += t[size_t(i * 10 + k)];
    EXPECT_NEAR(sum, 1.0, 1e-6);
    const double lam = p.samples[size_t(i)].lam, floor = 0.01;
    const int64_t a = y[size_t(i)], b = y[size_t(5 - i)];
    if (a != b) {
      EXPECT_NEAR(t[size_t(i * 10 + a)], floor + 0.9 * lam, 1e-6);
      EXPECT_NEAR(t[size_t(i * 10 + b)], floor + 0.9 * (1 - lam), 1e-6);
    } else {
      EXPECT_NEAR(t[size_t(i * 10 + a)], floor + 0.9, 1e-6);
    }
  }
}

TEST(MixupConfig, BadValuesAreRefused) {
  EXPECT_THROW(parse_mix_mode("rows"), ValueError);
  EXPECT_EQ(parse_cutmix_minmax("0.2,0.8", "--cutmix-minmax"), std::make_pair(0.2, 0.8));
  for (const char* bad : {"0.8,0.2", "0.2", "a,b", "0.2,1.5", "-0.1,0.5", "0.2,0.8,", "0.2,0.8x"}) {
    try {
      parse_cutmix_minmax(bad, "--cutmix-minmax");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("--cutmix-minmax"), std::string::npos) << e.what();
    }
  }
  MixConfig c = config(0, 0);
  c.cutmix_minmax = std::make_pair(0.30, 0.33);  // [int(9.6), int(10.56)) = [9, 10) at 32 px: one side
  EXPECT_NO_THROW(check_mix_config(c, 32));
  c.cutmix_minmax = std::make_pair(0.30, 0.31);  // [9, 9): empty
  EXPECT_THROW(check_mix_config(c, 32), ValueError);
  CounterRng rng = mix_stream(0, 0, 0);
  EXPECT_THROW(draw_mix(config(0.8, 0), 5, 8, 8, rng), ValueError);  // odd batch
}

}  // namespace
}  // namespace cz
