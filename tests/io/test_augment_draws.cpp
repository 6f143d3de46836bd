// What RandAugment and random erasing draw: the `--aa` grammar and its errors, the per-image draws against
// the distributions timm's code defines, random erasing's statistics against timm's own
// (tests/data/random_erasing_timm.json), and the loader with both on: N ranks equal one rank at any thread
// count, a restart mid-epoch gives the same batches, and the images are the documented pipeline's.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "common/error_of.h"
#include "io/augment/randaugment.h"
#include "io/augment/random_erasing.h"
#include "io/data/loader.h"
#include "io_testing.h"

namespace cz {
namespace {

TEST(RandAugmentConfig, ParsesTimmsGrammar) {
  const RandAugmentConfig r = parse_rand_augment("rand-m9-mstd0.5-inc1");
  EXPECT_TRUE(r.enabled);
  EXPECT_EQ(r.magnitude, 9);
  EXPECT_EQ(r.layers, 2);  // timm's defaults
  EXPECT_EQ(r.prob, 0.5);
  EXPECT_EQ(r.magnitude_std, 0.5);
  EXPECT_EQ(r.magnitude_max, 10);
  EXPECT_TRUE(r.increasing);
  EXPECT_FALSE(r.weighted);
  EXPECT_EQ(ra_op_set(r).size(), 15u);
  EXPECT_EQ(ra_op_set(r)[4], RaOp::PosterizeIncreasing);
  const RandAugmentConfig s = parse_rand_augment("rand-n3-m12-p0.8-mmax20-mstd101-tweights");
  EXPECT_EQ(s.layers, 3);
  EXPECT_EQ(s.magnitude, 12);
  EXPECT_EQ(s.prob, 0.8);
  EXPECT_EQ(s.magnitude_max, 20);
  EXPECT_TRUE(std::isinf(s.magnitude_std));  // above 100: uniform in [0, m]
  EXPECT_TRUE(s.weighted);
  EXPECT_EQ(ra_op_weights(s).size(), ra_op_set(s).size());
  EXPECT_EQ(parse_rand_augment("rand").magnitude, 10);
  EXPECT_FALSE(parse_rand_augment("").enabled);
  EXPECT_FALSE(parse_rand_augment("none").enabled);
  EXPECT_EQ(ra_op_set(parse_rand_augment("rand-inc0"))[4], RaOp::Posterize);
}

TEST(RandAugmentConfig, MalformedStringsNameTheFlagAndTheBadPart) {
  const auto err = [](const std::string& spec) {
    return error_of<ValueError>([&] { parse_rand_augment(spec, "--aa"); });
  };
  for (const auto& [spec, part] : std::vector<std::pair<std::string, std::string>>{
           {"v0", "starts with 'v0'; only RandAugment"},
           {"augmix-m5", "starts with 'augmix'"},
           {"rand-m9-x3", "unknown key 'x' in section 'x3'"},
           {"rand-m", "section 'm' has no number"},
           {"rand-m9-", "section 3 is empty"},
           {"rand--m9", "section 2 is empty"},
           {"rand-m9.5", "'9.5' in section 'm9.5' is not a whole number"},
           {"rand-mstd0.5x", "'0.5x' in section 'mstd0.5x' is not a number"},
           {"rand-m9-m10", "'m' is given twice"},
           {"rand-p1.5", "p1.5 is not a probability"},
           {"rand-inc2", "inc2 is not 0 or 1"},
           {"rand-mmax0", "mmax0 is not an upper bound"},
           {"rand-n65", "n65 layers is more than 64"},
           {"rand-t3a", "transform set '3a' in section 't3a' is not supported"},
           {"rand-n16-tweights", "n16 layers without replacement from the 15 weighted ops"},
           {"rand-m99999999999", "'99999999999' in section 'm99999999999' is too large"},
       }) {
    const std::string e = err(spec);
    EXPECT_NE(e.find("--aa '" + spec + "'"), std::string::npos) << e;
    EXPECT_NE(e.find(part), std::string::npos) << spec << ": " << e;
  }
}

TEST(RandAugmentOps, PosterizeZeroBitsIsBlackAndLevelFunctionsAreTimms) {
  // Note [Posterize to 0 bits].
  Image img{2, 3, {0, 1, 127, 128, 200, 255, 3, 64, 65, 99, 254, 7, 8, 9, 10, 11, 12, 13}};
  apply_ra_op(RaOp::PosterizeIncreasing, ra_op_argument(RaOp::PosterizeIncreasing, 10, false), img,
              Interpolation::bilinear);
  for (uint8_t v : img.pixels) EXPECT_EQ(v, 0);
  // A few of timm's level functions at its endpoints, written out (the fixture checks them all, in between).
  EXPECT_EQ(ra_op_argument(RaOp::Rotate, 10, true), -30.0);
  EXPECT_EQ(ra_op_argument(RaOp::Solarize, 10, false), 256.0);
  EXPECT_EQ(ra_op_argument(RaOp::SolarizeIncreasing, 10, false), 0.0);
  EXPECT_EQ(ra_op_argument(RaOp::SolarizeAdd, 10, false), 110.0);
  EXPECT_EQ(ra_op_argument(RaOp::ColorIncreasing, 10, true), 0.1);
  EXPECT_EQ(ra_op_argument(RaOp::Color, 0, false), 0.1);
  EXPECT_EQ(ra_op_argument(RaOp::TranslateXRel, 10, false), 0.45);
  Image sq{4, 4, std::vector<uint8_t>(48)};
  for (size_t i = 0; i < sq.pixels.size(); ++i) sq.pixels[i] = uint8_t(i * 5);
  Image r = sq;
  rotate(r, 180, Interpolation::bicubic, ra_fill());  // PIL transposes exactly at 180
  for (int64_t p = 0; p < 16; ++p)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(r.pixels[size_t(p * 3 + c)], sq.pixels[size_t((15 - p) * 3 + c)]);
}

TEST(RandAugmentOps, EveryOpKeepsTheSizeOfTinyAndOddImages) {
  // Images of one row, one column, 2x3 (under the 3x3 smoothing filter) and a long strip, through every op at
  // every magnitude, either sign and both filters, and through the 8-bit resize.
  for (const auto& [h, w] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 7}, {7, 1}, {2, 3}, {3, 3}, {5, 40}}) {
    Image src{h, w, std::vector<uint8_t>(size_t(h * w * 3))};
    for (size_t i = 0; i < src.pixels.size(); ++i) src.pixels[i] = uint8_t(i * 37 % 256);
    for (int op = 0; op < kRaOpCount; ++op)
      for (double m : {0.0, 3.0, 10.0})
        for (bool neg : {false, true})
          for (Interpolation f : {Interpolation::bilinear, Interpolation::bicubic}) {
            Image img = src;
            apply_ra_op(RaOp(op), ra_op_argument(RaOp(op), m, neg), img, f);
            ASSERT_EQ(img.height, h);
            ASSERT_EQ(img.width, w);
            ASSERT_EQ(img.pixels.size(), src.pixels.size()) << ra_op_name(RaOp(op));
          }
    for (int64_t size : {1, 4, 9}) {
      Image out;
      resample_u8(src, {0, 0, h, w, true}, size, Interpolation::bicubic, out);
      ASSERT_EQ(out.pixels.size(), size_t(size * size * 3));
    }
  }
  // An image of one colour keeps it through the resize (the coefficients of each output sum to 1 in 22 bits).
  Image flat{9, 13, std::vector<uint8_t>(9 * 13 * 3, 200)};
  Image out;
  resample_u8(flat, {1, 2, 7, 10, false}, 5, Interpolation::bicubic, out);
  for (uint8_t v : out.pixels) EXPECT_EQ(v, 200);
}

// Draws of rand_augment on a tiny image, many times: what was applied, against timm's definitions.
std::vector<std::vector<RaApplied>> draw_many(const RandAugmentConfig& cfg, int n) {
  std::vector<std::vector<RaApplied>> out;
  for (int i = 0; i < n; ++i) {
    Image img{4, 4, std::vector<uint8_t>(48, 100)};
    CounterRng rng = sample_stream(5, RngDomain::randaugment, 0, i);
    out.push_back(rand_augment(cfg, img, Interpolation::bilinear, rng));
  }
  return out;
}

TEST(RandAugmentDraws, OpsCountsMagnitudesAndSignsFollowTimmsDefinitions) {
  constexpr int kImages = 30000;
  const RandAugmentConfig cfg = parse_rand_augment("rand-m9-mstd0.5-inc1");
  const auto draws = draw_many(cfg, kImages);
  std::map<int, int> per_image;
  std::map<RaOp, int> per_op;
  int negated = 0, negatable = 0;
  double msum = 0, msq = 0;
  int64_t applied = 0;
  for (const auto& d : draws) {
    ++per_image[int(d.size())];
    for (const RaApplied& a : d) {
      ++per_op[a.op];
      msum += a.magnitude;
      msq += a.magnitude * a.magnitude;
      ++applied;
      EXPECT_LE(a.magnitude, 10.0);
      if (a.op == RaOp::Rotate || a.op == RaOp::ShearX) {
        ++negatable;
        negated += a.arg < 0;
      }
    }
  }
  // Two layers, each applied with probability 1/2: Binomial(2, 1/2) ops per image.
  const double se_n = std::sqrt(0.25 / kImages);
  EXPECT_NEAR(per_image[0] / double(kImages), 0.25, 4 * std::sqrt(0.25 * 0.75 / kImages));
  EXPECT_NEAR(per_image[1] / double(kImages), 0.50, 4 * se_n * 2);
  EXPECT_NEAR(per_image[2] / double(kImages), 0.25, 4 * std::sqrt(0.25 * 0.75 / kImages));
  // Uniform over the 15 ops of the increasing set.
  ASSERT_EQ(per_op.size(), 15u);
  for (const auto& [op, k] : per_op)
    EXPECT_NEAR(k / double(applied), 1.0 / 15, 4 * std::sqrt((1.0 / 15) * (14.0 / 15) / applied))
        << ra_op_name(op);
  // Magnitude: N(9, 0.5) clamped to [0, 10]; its mean and standard deviation by numerical integration.
  double m1 = 0, m2 = 0;
  const double step = 1e-4, mu = 9, sigma = 0.5;
  for (double x = mu - 10 * sigma; x < 10; x += step) {
    const double f = std::exp(-0.5 * ((x + step / 2 - mu) / sigma) * ((x + step / 2 - mu) / sigma)) /
                     (sigma * std::sqrt(2 * M_PI)) * step;
    m1 += (x + step / 2) * f, m2 += (x + step / 2) * (x + step / 2) * f;
  }
  const double above = 0.5 * std::erfc((10 - mu) / (sigma * std::sqrt(2.0)));  // P(X >= 10): clamped to 10
  m1 += 10 * above, m2 += 100 * above;
  const double sd = std::sqrt(m2 - m1 * m1), our_mean = msum / applied;
  EXPECT_NEAR(our_mean, m1, 4 * sd / std::sqrt(double(applied)));
  EXPECT_NEAR(std::sqrt(msq / applied - our_mean * our_mean), sd, 4 * sd / std::sqrt(2.0 * applied));
  EXPECT_LT(sd, sigma);  // the clamp is there
  EXPECT_NEAR(negated / double(negatable), 0.5, 4 * std::sqrt(0.25 / negatable));
}

TEST(RandAugmentDraws, UniformMagnitudeAndWeightedChoiceWithoutReplacement) {
  constexpr int kImages = 20000;
  // mstd > 100: uniform in [0, m].
  double msum = 0;
  int64_t k = 0;
  for (const auto& d : draw_many(parse_rand_augment("rand-m8-mstd101-p1.0"), kImages))
    for (const RaApplied& a : d) msum += a.magnitude, ++k;
  EXPECT_EQ(k, 2 * kImages);  // p = 1: every layer applies
  EXPECT_NEAR(msum / k, 4.0, 4 * 8 / std::sqrt(12.0 * k));
  // tweights: two distinct ops, op a included with probability p_a + sum_b p_b p_a / (1 - p_b).
  const RandAugmentConfig w = parse_rand_augment("rand-tweights-p1.0");
  const std::vector<RaOp> set = ra_op_set(w);
  std::vector<double> p = ra_op_weights(w);
  double total = 0;
  for (double v : p) total += v;
  for (double& v : p) v /= total;
  std::map<RaOp, int> included;
  for (const auto& d : draw_many(w, kImages)) {
    ASSERT_EQ(d.size(), 2u);
    EXPECT_NE(d[0].op, d[1].op);
    for (const RaApplied& a : d) ++included[a.op];
  }
  for (size_t a = 0; a < set.size(); ++a) {
    double expect = p[a];
    for (size_t b = 0; b < set.size(); ++b)
      if (b != a) expect += p[b] * p[a] / (1 - p[b]);
    EXPECT_NEAR(included[set[a]] / double(kImages), expect,
                4 * std::sqrt(expect * (1 - expect) / kImages) + 1e-3)
        << ra_op_name(set[a]);
  }
}

// Random erasing against timm's RandomErasing, statistic by statistic (tools/make_randaugment_fixtures.py).
TEST(RandomErasing, StatisticsMatchTimms) {
  std::ifstream in(std::string(CZ_TEST_DATA_DIR) + "/random_erasing_timm.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json fixture = nlohmann::json::parse(in);
  int64_t key = 0;
  for (const nlohmann::json& t : fixture["configs"]) {
    const RandomErasingConfig cfg{t["probability"].get<double>(),
                                  parse_erase_mode(t["mode"].get<std::string>()), t["count"].get<int>()};
    const int64_t h = t["height"], w = t["width"], draws = t["draws"];
    const std::string what = fmt::format("p {} mode {} count {} {}x{}", cfg.probability,
                                         t["mode"].get<std::string>(), cfg.max_count, h, w);
    std::vector<float> img(size_t(h * w * 3));
    std::vector<int64_t> per_image(size_t(cfg.max_count + 1), 0);
    std::vector<double> area, log_aspect, cy, cx;
    double fsum[3] = {0, 0, 0}, fsq[3] = {0, 0, 0};
    int64_t fn = 0, erased = 0;
    for (int64_t i = 0; i < draws; ++i) {
      std::fill(img.begin(), img.end(), std::nanf(""));
      CounterRng rng = sample_stream(uint64_t(++key), RngDomain::erase, 0, i);
      const std::vector<EraseBox> boxes = random_erase(cfg, img.data(), h, w, rng);
      ++per_image[boxes.size()];
      erased += !boxes.empty();
      for (const EraseBox& b : boxes) {
        ASSERT_TRUE(b.h < h && b.w < w && b.top + b.h <= h && b.left + b.w <= w) << what;
        area.push_back(double(b.h * b.w) / double(h * w));
        if (b.h && b.w) log_aspect.push_back(std::log(double(b.h) / double(b.w)));
        cy.push_back((b.top + b.h / 2.0) / double(h));
        cx.push_back((b.left + b.w / 2.0) / double(w));
      }
      if (boxes.size() == 1) {  // one box: its values are exactly what was written
        const EraseBox& b = boxes[0];
        for (int64_t y = b.top; y < b.top + b.h; ++y)
          for (int64_t x = b.left; x < b.left + b.w; ++x, ++fn)
            for (int c = 0; c < 3; ++c) {
              const float v = img[size_t((y * w + x) * 3 + c)];
              fsum[c] += v, fsq[c] += double(v) * v;
            }
      }
    }
    const auto mean = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return s / double(v.size());
    };
    const auto sd = [&](const std::vector<double>& v) {
      const double m = mean(v);
      double s = 0;
      for (double x : v) s += (x - m) * (x - m);
      return std::sqrt(s / double(v.size()));
    };
    const double pe = t["erased_fraction"];
    EXPECT_NEAR(double(erased) / draws, pe, 4 * std::sqrt(2 * pe * (1 - pe) / draws) + 1e-9) << what;
    for (int c = 0; c <= cfg.max_count; ++c) {
      const double q = t["boxes_per_image"][size_t(c)];
      EXPECT_NEAR(double(per_image[size_t(c)]) / draws, q, 4 * std::sqrt(2 * q * (1 - q) / draws) + 1e-9)
          << what << ": images with " << c << " boxes";
    }
    const double boxes = t["boxes"];
    const auto near = [&](double ours, double theirs, double sd_one, const char* name) {
      EXPECT_NEAR(ours, theirs, 4 * sd_one * std::sqrt(1 / boxes + 1 / double(area.size())))
          << what << ": " << name;
    };
    near(mean(area), t["area_mean"], t["area_std"], "area mean");
    near(sd(area), t["area_std"], t["area_std"].get<double>() / std::sqrt(2.0) * 1.5, "area sd");
    near(mean(log_aspect), t["log_aspect_mean"], t["log_aspect_std"], "log aspect mean");
    near(sd(log_aspect), t["log_aspect_std"], t["log_aspect_std"].get<double>() / std::sqrt(2.0) * 1.5,
         "log aspect sd");
    std::vector<double> sorted = area;
    std::sort(sorted.begin(), sorted.end());
    for (int qi = 0; qi < 3; ++qi) {
      const double ours = sorted[size_t(double(sorted.size() - 1) * (0.1 + 0.4 * qi))];
      EXPECT_NEAR(ours, t["area_quantiles"][size_t(qi)].get<double>(), 0.012)
          << what << ": area quantile " << qi;
    }
    // timm's centres come from 4000 single boxes (probability 1, count 1, const) on this image size: the
    // same.
    cy.clear(), cx.clear();
    for (int64_t i = 0; i < 4000; ++i) {
      CounterRng rng = sample_stream(uint64_t(++key), RngDomain::erase, 0, i);
      const EraseBox b = random_erase({1.0, EraseMode::constant, 1}, img.data(), h, w, rng).at(0);
      cy.push_back((b.top + b.h / 2.0) / double(h));
      cx.push_back((b.left + b.w / 2.0) / double(w));
    }
    const double sy = t["centre_y_std"], sx = t["centre_x_std"];
    EXPECT_NEAR(mean(cy), t["centre_y_mean"].get<double>(), 4 * sy * std::sqrt(2 / 4000.0)) << what;
    EXPECT_NEAR(mean(cx), t["centre_x_mean"].get<double>(), 4 * sx * std::sqrt(2 / 4000.0)) << what;
    EXPECT_NEAR(sd(cy), sy, 4 * sy / std::sqrt(4000.0)) << what;
    EXPECT_NEAR(sd(cx), sx, 4 * sx / std::sqrt(4000.0)) << what;
    for (int c = 0; c < 3; ++c) {
      const double m = fn ? fsum[c] / double(fn) : 0, s = fn ? std::sqrt(fsq[c] / double(fn) - m * m) : 0;
      if (cfg.mode == EraseMode::constant) {
        EXPECT_EQ(m, 0.0) << what;
        EXPECT_EQ(s, 0.0) << what;
      } else {
        // Per box (rand) the values are one draw per box, so the tolerance is set by the number of boxes.
        const double n_eff = cfg.mode == EraseMode::pixel ? double(fn) : boxes / 3;
        EXPECT_NEAR(m, t["fill_mean"][size_t(c)].get<double>(), 4 / std::sqrt(n_eff) + 0.01) << what;
        EXPECT_NEAR(s, t["fill_std"][size_t(c)].get<double>(), 4 / std::sqrt(n_eff) + 0.03) << what;
      }
    }
  }
}

TEST(RandomErasing, ModesAndErrors) {
  EXPECT_EQ(error_of<ValueError>([] { parse_erase_mode("zero", "--remode"); }),
            "--remode must be const, rand or pixel, got 'zero'");
  EXPECT_EQ(error_of<ValueError>([] { parse_interpolation("nearest"); }),
            "--interpolation must be bilinear or bicubic, got 'nearest'");
  // Probability 0 draws nothing and leaves the image alone.
  std::vector<float> img(8 * 8 * 3, 7.0f);
  CounterRng rng(1, 0);
  EXPECT_TRUE(random_erase({0.0, EraseMode::pixel, 1}, img.data(), 8, 8, rng).empty());
  for (float v : img) EXPECT_EQ(v, 7.0f);
  // `rand` writes one colour per box.
  for (int i = 0; i < 20; ++i) {
    std::fill(img.begin(), img.end(), 7.0f);
    CounterRng r(2, uint64_t(i) << 10);
    const auto boxes = random_erase({1.0, EraseMode::rand, 1}, img.data(), 8, 8, r);
    ASSERT_EQ(boxes.size(), 1u);
    const EraseBox& b = boxes[0];
    for (int64_t y = b.top; y < b.top + b.h; ++y)
      for (int64_t x = b.left; x < b.left + b.w; ++x)
        for (int c = 0; c < 3; ++c)
          EXPECT_EQ(img[size_t((y * 8 + x) * 3 + c)], img[size_t((b.top * 8 + b.left) * 3 + c)]);
  }
}

// The loader with RandAugment and erasing on.
LoaderOptions augmented_options() {
  LoaderOptions o;
  o.image_size = 16;
  o.augment = true;
  o.seed = 4;
  o.drop_last = false;
  o.interpolation = Interpolation::bicubic;
  o.rand_augment = parse_rand_augment("rand-m9-mstd0.5-inc1");
  o.erasing = {0.5, EraseMode::pixel, 2};
  return o;
}

std::vector<Batch> epoch_batches(std::shared_ptr<const Dataset> data, LoaderOptions opt, int64_t epoch,
                                 int64_t first = 0) {
  Loader loader(std::move(data), opt);
  loader.start_epoch(epoch, first);
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

TEST(AugmentedLoader, RanksTogetherEqualOneRankAtAnyThreadCountAndOnRestart) {
  auto data = open_dataset("synthetic:n=30,classes=3,size=24", Split::train, {});
  LoaderOptions one = augmented_options();
  const int world = 3, micro = 2;
  one.batch_size = world * micro;
  one.threads = 2;
  const auto whole = epoch_batches(data, one, 1);
  ASSERT_EQ(whole.size(), 5u);
  std::vector<std::vector<Batch>> parts;
  for (int r = 0; r < world; ++r) {
    LoaderOptions opt = one;
    opt.world = world;
    opt.rank = r;
    opt.threads = r;  // 0: on the caller's thread
    parts.push_back(epoch_batches(data, opt, 1));
  }
  for (size_t b = 0; b < whole.size(); ++b) {
    std::vector<float> pixels;
    for (int r = 0; r < world; ++r) {
      const auto px = parts[size_t(r)][b].images.to_vector<float>();
      pixels.insert(pixels.end(), px.begin(), px.end());
    }
    EXPECT_EQ(pixels, whole[b].images.to_vector<float>()) << "batch " << b;
  }
  // A run restarted at batch 3 of the epoch (a resume) gets batches 3 and 4 as they were.
  const auto resumed = epoch_batches(data, one, 1, 3);
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t b = 0; b < 2; ++b)
    EXPECT_EQ(resumed[b].images.to_vector<float>(), whole[b + 3].images.to_vector<float>());
  // Another epoch is augmented differently.
  const auto other = epoch_batches(data, one, 2);
  EXPECT_NE(other[0].images.to_vector<float>(), whole[0].images.to_vector<float>());
}

TEST(AugmentedLoader, ImagesAreCropFlipRandAugmentNormaliseErase) {
  auto data = open_dataset("synthetic:n=8,classes=2,size=24", Split::train, {});
  LoaderOptions opt = augmented_options();
  opt.batch_size = 8;
  opt.shuffle = false;
  opt.threads = 0;
  const auto batches = epoch_batches(data, opt, 0);
  ASSERT_EQ(batches.size(), 1u);
  const std::vector<float> got = batches[0].images.to_vector<float>();
  const int64_t s = opt.image_size, n = s * s * 3;
  int changed_by_ra = 0, erased = 0;
  for (int64_t i = 0; i < 8; ++i) {
    Image img, crop;
    data->read(i, img);
    CounterRng crop_rng(rng_key(opt.seed, RngDomain::augment), (uint64_t(0) << 36 | uint64_t(i)) << 6);
    const CropBox box = random_resized_crop(img.height, img.width, crop_rng);
    resample_u8(img, box, s, opt.interpolation, crop);
    CounterRng ra_rng = sample_stream(opt.seed, RngDomain::randaugment, 0, i);
    changed_by_ra += !rand_augment(opt.rand_augment, crop, opt.interpolation, ra_rng).empty();
    std::vector<float> want(static_cast<size_t>(n));
    normalise_u8(crop, want.data());
    CounterRng er_rng = sample_stream(opt.seed, RngDomain::erase, 0, i);
    erased += !random_erase(opt.erasing, want.data(), s, s, er_rng).empty();
    EXPECT_EQ(std::vector<float>(got.begin() + i * n, got.begin() + (i + 1) * n), want) << "image " << i;
  }
  EXPECT_GT(changed_by_ra, 0);  // the seed gives both augmentations something to do
  EXPECT_GT(erased, 0);
}

TEST(AugmentedLoader, BicubicDiffersFromBilinearOnTheWholeImageResize) {
  auto data = open_dataset("synthetic:n=4,classes=2,size=40", Split::train, {});
  LoaderOptions opt = testing::in_order(4, 16);
  opt.drop_last = false;
  opt.threads = 0;
  const auto bilinear = epoch_batches(data, opt, 0)[0].images.to_vector<float>();
  opt.interpolation = Interpolation::bicubic;
  const auto bicubic = epoch_batches(data, opt, 0)[0].images.to_vector<float>();
  ASSERT_EQ(bilinear.size(), bicubic.size());
  double diff = 0;
  for (size_t i = 0; i < bilinear.size(); ++i)
    diff = std::max(diff, double(std::abs(bilinear[i] - bicubic[i])));
  EXPECT_GT(diff, 0.01);  // a visible difference (in normalised units)
  EXPECT_LT(diff, 1.0);   // but the same picture
}

}  // namespace
}  // namespace cz
