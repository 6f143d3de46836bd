// Decoding a JPEG's crop only (Note [Decoding the crop], io/decode/jpeg_region.h): bit for bit the whole
// decode's pixels where unscaled, for every chroma subsampling and many boxes, and the PSNR of the DCT-scaled
// decode against the whole decode box-filtered to the same scale. Real files: written with TurboJPEG, read
// back.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "io/data/loader.h"
#include "io/decode/image_codec.h"
#include "io/decode/jpeg_region.h"
#include "io_testing.h"
#include "tensor/check.h"

namespace cz {
namespace {

using testing::encode_png, testing::smooth_image, testing::TempDir, testing::write_bytes,
    testing::write_h5_images;

// A photograph-like test image: smooth fields and waves plus per-pixel noise and a few hard edges, so that
// every 8x8 block has detail in each channel (chroma included).
Image textured(int64_t h, int64_t w, uint32_t seed) {
  Image img = smooth_image(h, w, seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(-24, 24);
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j)
      for (int ch = 0; ch < 3; ++ch) {
        uint8_t& p = img.pixels[size_t((i * w + j) * 3 + ch)];
        const int edge = ((i / 37 + j / 23 + ch) % 3 == 0) ? 60 : 0;
        p = uint8_t(std::clamp(int(p) + noise(rng) + edge, 0, 255));
      }
  return img;
}

std::vector<uint8_t> encode(const Image& img, int subsamp, int quality) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, img.pixels.data(), int(img.width), 0, int(img.height), TJPF_RGB, &buf, &size,
                             subsamp, quality, 0);
  std::vector<uint8_t> out(buf, buf + (rc == 0 ? size : 0));
  tjFree(buf);
  tjDestroy(tj);
  EXPECT_EQ(rc, 0);
  return out;
}

struct Case {
  int subsamp;
  const char* name;
};
const Case kCases[] = {{TJSAMP_444, "444"},
                       {TJSAMP_422, "422"},
                       {TJSAMP_420, "420"},
                       {TJSAMP_GRAY, "grey"},
                       {TJSAMP_440, "440"}};

// The file written and read back, so the bytes are a real file's.
std::vector<uint8_t> jpeg_file(const TempDir& dir, const Image& img, const Case& c, int quality) {
  const std::string path = (dir.path() / fmt::format("{}_{}.jpg", c.name, quality)).string();
  write_bytes(path, encode(img, c.subsamp, quality));
  return read_file_bytes(path);
}

TEST(JpegRegion, WholeThenCropBitExact) {
  TempDir dir;
  std::mt19937 rng(7);
  JpegRegion reused;  // decoded into box after box, image after image, as the loader does: the same pixels
  for (const Case& c : kCases)
    for (auto [h, w] : {std::pair<int64_t, int64_t>{333, 517}, {64, 48}, {17, 401}}) {
      const Image img = textured(h, w, uint32_t(h * w));
      const std::vector<uint8_t> bytes = jpeg_file(dir, img, c, 90);
      Image whole;
      decode_image(bytes.data(), bytes.size(), "whole", whole);
      const auto info = jpeg_region_info(bytes.data(), bytes.size(), "info");
      ASSERT_TRUE(info.has_value());
      EXPECT_EQ(info->height, h);
      EXPECT_EQ(info->width, w);
      std::vector<std::array<int64_t, 4>> boxes = {{0, 0, h, w}, {h - 1, w - 1, 1, 1}, {0, w - 1, h, 1}};
      for (int k = 0; k < 60; ++k) {
        const int64_t bh = std::uniform_int_distribution<int64_t>(1, h)(rng);
        const int64_t bw = std::uniform_int_distribution<int64_t>(1, w)(rng);
        boxes.push_back({std::uniform_int_distribution<int64_t>(0, h - bh)(rng),
                         std::uniform_int_distribution<int64_t>(0, w - bw)(rng), bh, bw});
      }
      for (const auto& [y, x, bh, bw] : boxes) {
        const JpegRegion r = decode_jpeg_region(bytes.data(), bytes.size(), "region", y, x, bh, bw, 1);
        decode_jpeg_region(bytes.data(), bytes.size(), "region", y, x, bh, bw, 1, reused);
        ASSERT_EQ(reused.image.pixels, r.image.pixels);
        ASSERT_EQ(reused.image.height, r.image.height);
        ASSERT_EQ(reused.image.width, r.image.width);
        ASSERT_EQ(r.top, y);
        ASSERT_EQ(r.left, x);
        ASSERT_EQ(r.image.height, bh);
        ASSERT_EQ(r.image.width, bw);
        for (int64_t i = 0; i < r.image.height; ++i) {
          const uint8_t* got = r.image.pixels.data() + i * r.image.width * 3;
          const uint8_t* want = whole.pixels.data() + ((r.top + i) * w + r.left) * 3;
          ASSERT_EQ(0, std::memcmp(got, want, size_t(r.image.width * 3)))
              << c.name << " " << h << "x" << w << " box (" << y << ", " << x << ") " << bh << "x" << bw
              << ": row " << i << " differs";
        }
      }
    }
}

// PSNR of the 1/denom decode of a whole image against the full decode averaged over denom x denom blocks
// (what an antialiased resize by 1/denom would start from).
double scaled_psnr(const std::vector<uint8_t>& bytes, const Image& whole, int denom) {
  const JpegRegion r =
      decode_jpeg_region(bytes.data(), bytes.size(), "scaled", 0, 0, whole.height, whole.width, denom);
  const int64_t h = whole.height / denom, w = whole.width / denom;
  double se = 0;
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j)
      for (int ch = 0; ch < 3; ++ch) {
        double sum = 0;
        for (int a = 0; a < denom; ++a)
          for (int b = 0; b < denom; ++b)
            sum += whole.pixels[size_t(((i * denom + a) * whole.width + j * denom + b) * 3 + ch)];
        const double d = sum / (denom * denom) - r.image.pixels[size_t((i * r.image.width + j) * 3 + ch)];
        se += d * d;
      }
  return 10 * std::log10(255.0 * 255.0 / (se / double(h * w * 3)));
}

TEST(JpegRegion, ScaledPsnr) {
  TempDir dir;
  const Image img = textured(480, 640, 3);
  for (const Case& c : kCases)
    for (int quality : {75, 95}) {
      const std::vector<uint8_t> bytes = jpeg_file(dir, img, c, quality);
      Image whole;
      decode_image(bytes.data(), bytes.size(), "whole", whole);
      for (int denom : {2, 4, 8}) {
        const double psnr = scaled_psnr(bytes, whole, denom);
        std::printf("%s q%d 1/%d: PSNR %.1f dB\n", c.name, quality, denom, psnr);
        // Note [Decoding the crop]: unevenly subsampled chroma loses more at 1/8.
        const bool uneven = c.subsamp == TJSAMP_422 || c.subsamp == TJSAMP_440;
        EXPECT_GE(psnr, uneven ? (denom == 8 ? 25.0 : 30.0) : 34.0)
            << c.name << " q" << quality << " 1/" << denom;
      }
    }
}

TEST(JpegRegion, ScaleChoice) {
  EXPECT_EQ(jpeg_scale_for(375, 500, 224), 1);
  EXPECT_EQ(jpeg_scale_for(448, 600, 224), 2);
  EXPECT_EQ(jpeg_scale_for(1800, 2000, 224), 8);
  EXPECT_EQ(jpeg_scale_for(900, 2000, 224), 4);
}

TEST(JpegRegion, CorruptAndForeignStreams) {
  TempDir dir;
  const Image img = textured(64, 64, 1);
  std::vector<uint8_t> bytes = encode(img, TJSAMP_420, 90);
  bytes.resize(bytes.size() / 2);  // truncated
  EXPECT_THROW(decode_jpeg_region(bytes.data(), bytes.size(), "cut.jpg", 0, 0, 64, 64, 1), IoError);
  const std::vector<uint8_t> png = encode_png(img);
  EXPECT_FALSE(jpeg_region_info(png.data(), png.size(), "x.png").has_value());
  const std::vector<uint8_t> ok = encode(img, TJSAMP_420, 90);
  EXPECT_THROW(decode_jpeg_region(ok.data(), ok.size(), "a.jpg", 10, 10, 60, 10, 1), ValueError);
}

// The loader on a folder of JPEGs (which decodes only each crop) against the loader on an h5 file holding the
// same files' whole decodes (which crops the decoded image): the same batches, bit for bit, where no crop is
// scaled (224 px from 333x517 images: every crop is under 448 px on its shorter side), with and without
// RandAugment's 8-bit path; and close where the DCT scales the crops (32 px).
class JpegRegionLoader : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<Image> whole;
    std::vector<int64_t> labels;
    for (int k = 0; k < 12; ++k) {
      const char* cls = k % 2 ? "b" : "a";
      std::filesystem::create_directories(dir_.path() / "f" / cls);
      const Image img = textured(333, 517, uint32_t(100 + k));
      const std::string path = dir_.str(fmt::format("f/{}/img_{:02d}.jpg", cls, k / 2));
      write_bytes(path, encode(img, k % 3 == 0 ? TJSAMP_444 : TJSAMP_420, 85));
      files_.push_back(path);
    }
    std::sort(files_.begin(), files_.end());  // the folder source's order: class, then name
    for (const std::string& path : files_) {
      const std::vector<uint8_t> bytes = read_file_bytes(path);
      whole.emplace_back();
      decode_image(bytes.data(), bytes.size(), path, whole.back());
      labels.push_back(path.find("/f/b/") != std::string::npos);
    }
    write_h5_images(dir_.str("whole.h5"), whole, labels);
  }
  std::vector<Batch> batches(const std::string& spec, int64_t size, bool rand_augment) {
    LoaderOptions o = testing::loader_options(4, size);
    o.augment = true;
    o.seed = 5;
    o.threads = 0;
    if (rand_augment) o.rand_augment = parse_rand_augment("rand-m9-mstd0.5-inc1");
    Loader loader(open_dataset(spec, Split::train, {}), o);
    std::vector<Batch> out;
    for (int e = 0; e < 2; ++e) {
      loader.start_epoch(e);
      while (auto b = loader.next()) out.push_back(std::move(*b));
    }
    return out;
  }
  TempDir dir_;
  std::vector<std::string> files_;
};

TEST_F(JpegRegionLoader, UnscaledCropsEqualWholeDecode) {
  for (bool ra : {false, true}) {
    const auto folder = batches("folder:" + dir_.str("f"), 224, ra);
    const auto h5 = batches("h5:" + dir_.str("whole.h5"), 224, ra);
    ASSERT_EQ(folder.size(), h5.size());
    for (size_t b = 0; b < folder.size(); ++b) {
      const Tensor& x = folder[b].images;
      ASSERT_EQ(folder[b].sources, h5[b].sources);
      ASSERT_EQ(0, std::memcmp(x.data<float>(), h5[b].images.data<float>(), size_t(x.numel()) * 4))
          << "batch " << b << (ra ? " with RandAugment" : "");
    }
  }
}

TEST_F(JpegRegionLoader, ScaledCropsClose) {
  const auto folder = batches("folder:" + dir_.str("f"), 32, false);
  const auto h5 = batches("h5:" + dir_.str("whole.h5"), 32, false);
  ASSERT_EQ(folder.size(), h5.size());
  double se = 0, n = 0;
  for (size_t b = 0; b < folder.size(); ++b) {
    const float* x = folder[b].images.data<float>();
    const float* y = h5[b].images.data<float>();
    for (int64_t i = 0; i < folder[b].images.numel(); ++i) {
      const double d = double(x[i] - y[i]) * kImageNetStd[i % 3] * 255;  // in 8-bit levels
      se += d * d;
      n += 1;
    }
  }
  const double psnr = 10 * std::log10(255.0 * 255.0 / (se / n));
  std::printf("32 px batches from DCT-scaled crops against whole decodes: PSNR %.1f dB\n", psnr);
  EXPECT_GE(psnr, 30.0);
}

}  // namespace
}  // namespace cz
