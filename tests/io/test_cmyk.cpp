// CMYK and YCCK JPEGs (Note [CMYK JPEGs] in image_codec.cpp) decode to the RGB that PIL gives: against PIL's
// own decode of committed files (tools/make_cmyk_fixtures.py), and against PIL's conversion formula on files
// this test writes with TurboJPEG.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "io/data/dataset.h"
#include "io/decode/image_codec.h"
#include "io_testing.h"
#include "tensor/check.h"

namespace cz {
namespace {

std::string fixture(const std::string& name) {
  return std::string(CZ_TEST_DATA_DIR) + "/" + name;
}

Image decode_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  Image out;
  decode_image(bytes.data(), bytes.size(), path, out);
  return out;
}

// PIL's CMYK -> RGB (Convert.c, cmyk2rgb), written from its definition on ink amounts: with ink c and black
// k, R = (255 - k) - round(c (255 - k) / 255). `stored` holds Adobe's inverted samples (255 - ink).
uint8_t pil_channel(uint8_t stored_c, uint8_t stored_k) {
  const double ink = 255 - stored_c, not_black = stored_k;
  return uint8_t(not_black - std::lround(ink * not_black / 255.0));
}

// `stored` (h, w, 4) CMYK samples compressed by TurboJPEG, which writes them as YCCK (Adobe transform 2).
std::vector<uint8_t> encode_ycck(const std::vector<uint8_t>& stored, int w, int h) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj, stored.data(), w, 0, h, TJPF_CMYK, &buf, &size, TJSAMP_444, 95, 0) != 0)
    throw std::runtime_error(std::string("tjCompress2: ") + tjGetErrorStr2(tj));
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

// The CMYK samples libjpeg decodes from `jpeg`, before any conversion to RGB.
std::vector<uint8_t> decode_samples(const std::vector<uint8_t>& jpeg, int w, int h) {
  tjhandle tj = tjInitDecompress();
  std::vector<uint8_t> out(size_t(w) * size_t(h) * 4);
  const int rc = tjDecompress2(tj, jpeg.data(), static_cast<unsigned long>(jpeg.size()), out.data(), w, 0, h,
                               TJPF_CMYK, 0);
  tjDestroy(tj);
  if (rc != 0) throw std::runtime_error("tjDecompress2 to CMYK failed");
  return out;
}

// Adobe-inverted samples of a picture whose every channel, black included, varies across it.
std::vector<uint8_t> stored_picture(int w, int h) {
  std::vector<uint8_t> s(size_t(w) * size_t(h) * 4);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const double u = double(x) / (w - 1), v = double(y) / (h - 1);
      const double ink[4] = {255 * u, 255 * v, 127.5 + 127.5 * std::sin(6 * u + 3 * v), 200 * (1 - u) * v};
      for (int c = 0; c < 4; ++c) s[size_t((y * w + x) * 4 + c)] = uint8_t(255 - std::lround(ink[c]));
    }
  return s;
}

// Adobe Photoshop's plain CMYK (transform 0, written by PIL) and YCCK (transform 2, written by TurboJPEG):
// the same bytes as PIL 9.4's `Image.open(f).convert("RGB")` on Debian 12 (same libjpeg-turbo). Another
// libjpeg build may round its inverse DCT differently: 2 levels allowed, which no polarity or formula error
// fits in.
TEST(CmykJpeg, DecodesAsPilDoes) {
  for (const std::string name : {"cmyk_adobe", "ycck_adobe"}) {
    const Image ours = decode_file(fixture(name + ".jpg"));
    const Image pil = decode_file(fixture(name + "_pil.png"));
    ASSERT_EQ(ours.height, 16) << name;
    ASSERT_EQ(ours.width, 24) << name;
    const testing::PixelDiff d = testing::pixel_diff(ours, pil);
    std::printf("%s: against PIL's decode, max difference %d, mean %.4f\n", name.c_str(), d.max, d.mean);
    EXPECT_LE(d.max, 2) << name << ": mean difference " << d.mean;
    EXPECT_LT(d.mean, 0.5) << name;
  }
}

// A YCCK file made here: our RGB is PIL's formula applied to libjpeg's decoded CMYK samples, exactly, and
// within JPEG's loss of the picture that was compressed.
TEST(CmykJpeg, YcckFromTurboJpegFollowsPilFormula) {
  const int w = 40, h = 24;
  const std::vector<uint8_t> stored = stored_picture(w, h);
  const std::vector<uint8_t> jpeg = encode_ycck(stored, w, h);
  Image ours;
  decode_image(jpeg.data(), jpeg.size(), "made.jpg", ours);
  ASSERT_EQ(ours.height, h);
  ASSERT_EQ(ours.width, w);
  const std::vector<uint8_t> samples = decode_samples(jpeg, w, h);
  Image from_samples{h, w, std::vector<uint8_t>(size_t(w * h * 3))}, from_source = from_samples;
  for (int p = 0; p < w * h; ++p)
    for (int c = 0; c < 3; ++c) {
      from_samples.pixels[size_t(p * 3 + c)] =
          pil_channel(samples[size_t(p * 4 + c)], samples[size_t(p * 4 + 3)]);
      from_source.pixels[size_t(p * 3 + c)] =
          pil_channel(stored[size_t(p * 4 + c)], stored[size_t(p * 4 + 3)]);
    }
  EXPECT_EQ(testing::pixel_diff(ours, from_samples).max, 0);
  const testing::PixelDiff d = testing::pixel_diff(ours, from_source);
  EXPECT_LT(d.mean, 2.0);
  EXPECT_LE(d.max, 16);
}

// A CMYK file cut short is still an error naming the file, not grey filler.
TEST(CmykJpeg, TruncatedIsAnError) {
  std::vector<uint8_t> bytes = read_file_bytes(fixture("ycck_adobe.jpg"));
  bytes.resize(bytes.size() / 2);
  Image out;
  try {
    decode_image(bytes.data(), bytes.size(), "half_ycck.jpg", out);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("half_ycck.jpg"), std::string::npos) << e.what();
  }
}

// The case: a CMYK photograph among RGB ones in a class folder is read like the others.
TEST(CmykJpeg, FolderSourceReadsIt) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() / "coffee");
  testing::write_bytes(dir.str("coffee/a.jpg"), testing::encode_jpeg(testing::smooth_image(16, 24, 1)));
  std::filesystem::copy_file(fixture("cmyk_adobe.jpg"), dir.path() / "coffee" / "zz_cmyk.jpg");
  auto data = open_dataset("folder:" + dir.str(), Split::train, {});
  ASSERT_EQ(data->size(), 2);
  Image img;
  data->read(1, img);
  EXPECT_LE(testing::pixel_diff(img, decode_file(fixture("cmyk_adobe_pil.png"))).max, 2);
}

}  // namespace
}  // namespace cz
