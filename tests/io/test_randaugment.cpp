// RandAugment's ops and the 8-bit resize against timm and PIL themselves (tests/data/randaugment_fixture.h5,
// made by tools/make_randaugment_fixtures.py with PyPI timm and Pillow): every op at several magnitudes, both
// signs and both filters, and torchvision's crop-and-resize, pixel for pixel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "io/augment/randaugment.h"
#include "io/h5/h5_file.h"

namespace cz {
namespace {

std::string fixture_path() {
  return std::string(CZ_TEST_DATA_DIR) + "/randaugment_fixture.h5";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) out.push_back(part);
  return out;
}

// Element i of an (N, H, W, 3) integer tensor as an 8-bit image.
Image image_at(const Tensor& t, int64_t i) {
  const int64_t h = t.size(-3), w = t.size(-2), n = h * w * 3;
  Image img{h, w, std::vector<uint8_t>(size_t(n))};
  const int64_t* p = t.data<int64_t>() + i * n;
  for (int64_t k = 0; k < n; ++k) img.pixels[size_t(k)] = uint8_t(p[k]);
  return img;
}

Interpolation pil_filter(int64_t code) {
  return code == 3 ? Interpolation::bicubic : Interpolation::bilinear;  // PIL: 2 BILINEAR, 3 BICUBIC
}

struct Diff {
  int max = 0;
  int64_t differing = 0, pixels = 0;
};

Diff compare(const Image& ours, const Image& theirs) {
  Diff d;
  for (size_t i = 0; i < ours.pixels.size(); ++i) {
    const int e = std::abs(int(ours.pixels[i]) - int(theirs.pixels[i]));
    d.max = std::max(d.max, e);
    d.differing += e != 0;
  }
  d.pixels = int64_t(ours.pixels.size());
  return d;
}

TEST(RandAugmentFixture, EveryOpEqualsTimmAtEveryMagnitude) {
  const h5::File f = h5::File::open(fixture_path());
  const std::vector<std::string> names = split(f.string_attr("ops"), ',');
  const Tensor images = f.read("images"), outs = f.read("out");
  const Tensor op = f.read("op"), img_index = f.read("image"), magnitude = f.read("magnitude"),
               negate = f.read("negate"), arg = f.read("arg"), resample = f.read("resample");
  const int64_t cases = op.numel();
  ASSERT_GT(cases, 100);
  std::map<std::string, Diff> per_op;
  std::map<std::string, int> seen;
  for (int64_t c = 0; c < cases; ++c) {
    const std::string& name = names[size_t(op.data<int64_t>()[c])];
    const std::optional<RaOp> o = ra_op_from_name(name);
    ASSERT_TRUE(o.has_value()) << name;
    const double m = magnitude.data<double>()[c], timm_arg = arg.data<double>()[c];
    const bool neg = negate.data<int64_t>()[c] != 0;
    // The level function: the argument timm computed from the magnitude (and the sign it was given).
    const double our_arg = ra_op_argument(*o, m, neg && ra_op_negates(*o));
    if (std::isnan(timm_arg))
      EXPECT_TRUE(std::isnan(our_arg)) << name;
    else
      EXPECT_EQ(our_arg, timm_arg) << name << " at magnitude " << m << (neg ? ", negated" : "");
    Image img = image_at(images, img_index.data<int64_t>()[c]);
    apply_ra_op(*o, our_arg, img, pil_filter(resample.data<int64_t>()[c]));
    const Diff d = compare(img, image_at(outs, c));
    const std::string key = name + (resample.data<int64_t>()[c] == 3   ? " bicubic"
                                    : resample.data<int64_t>()[c] == 2 ? " bilinear"
                                                                       : "");
    Diff& acc = per_op[key];
    acc.max = std::max(acc.max, d.max);
    acc.differing += d.differing;
    acc.pixels += d.pixels;
    ++seen[key];
    // Note [PIL's arithmetic]: every op, colour or geometric, repeats PIL's steps, so the output is PIL's to
    // the level.
    EXPECT_EQ(d.max, 0) << name << " at magnitude " << m << " (arg " << our_arg << ") on image "
                        << img_index.data<int64_t>()[c] << ": " << d.differing << " of " << d.pixels
                        << " values differ, by up to " << d.max;
  }
  // Every op of timm's two RandAugment sets is in the fixture (Posterize at every magnitude with bits >= 1).
  for (int i = 0; i < kRaOpCount; ++i) {
    const std::string name = ra_op_name(RaOp(i));
    EXPECT_TRUE(seen.count(name) || seen.count(name + " bilinear")) << name << " has no fixture case";
  }
  std::printf("RandAugment ops against timm %s (cases, largest difference in levels, values differing):\n",
              f.string_attr("versions").c_str());
  for (const auto& [key, d] : per_op)
    std::printf("  %-28s %3d cases  max %d  %lld of %lld\n", key.c_str(), seen[key], d.max,
                (long long)d.differing, (long long)d.pixels);
}

TEST(RandAugmentFixture, FillColourAndOrderAreTimmFactorys) {
  const h5::File f = h5::File::open(fixture_path());
  const std::vector<int64_t> fill = f.int_attrs("fill");
  const Rgb ours = ra_fill();
  ASSERT_EQ(fill.size(), 3u);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(int64_t(ours[size_t(c)]), fill[size_t(c)]);
  // timm's create_transform(is_training=True, auto_augment=..., re_prob=...) composes these in this order;
  // the loader does the same (Note [Sampling], loader.h): crop+resize, flip, RandAugment, to float and
  // normalise, erase.
  EXPECT_EQ(f.string_attr("pipeline"),
            "RandomResizedCropAndInterpolation,RandomHorizontalFlip,RandAugment,MaybeToTensor,Normalize,"
            "RandomErasing");
}

TEST(RandAugmentFixture, EightBitResizeEqualsTorchvisionResizedCrop) {
  const h5::File f = h5::File::open(fixture_path());
  const Tensor src_t = f.read("resize_src");
  Image src{src_t.size(0), src_t.size(1), std::vector<uint8_t>(size_t(src_t.numel()))};
  for (int64_t i = 0; i < src_t.numel(); ++i) src.pixels[size_t(i)] = uint8_t(src_t.data<int64_t>()[i]);
  const Tensor boxes = f.read("resize_box"), sizes = f.read("resize_size"),
               filters = f.read("resize_resample");
  ASSERT_GT(sizes.numel(), 10);
  for (int64_t r = 0; r < sizes.numel(); ++r) {
    const int64_t* b = boxes.data<int64_t>() + r * 4;
    const CropBox box{b[0], b[1], b[2], b[3], false};
    Image ours;
    resample_u8(src, box, sizes.data<int64_t>()[r], pil_filter(filters.data<int64_t>()[r]), ours);
    const Tensor theirs_t = f.read("resize_out_" + std::to_string(r));
    const Image theirs = image_at(theirs_t.reshape({1, theirs_t.size(0), theirs_t.size(1), 3}), 0);
    const Diff d = compare(ours, theirs);
    EXPECT_EQ(d.max, 0) << "box " << b[0] << "," << b[1] << " " << b[2] << "x" << b[3] << " to "
                        << sizes.data<int64_t>()[r] << " "
                        << interpolation_name(pil_filter(filters.data<int64_t>()[r])) << ": " << d.differing
                        << " values differ, by up to " << d.max;
  }
}

}  // namespace
}  // namespace cz
