// make_image_folder: writes a `folder:` data set of small JPEGs for the app tests (tests/dist/train/
// run_data_app_tests.sh), through the same TurboJPEG writer as the io tests.
//
//   make_image_folder DIR SIZE COUNT SEED CLASS=HUE [CLASS=HUE ...]
//
// DIR/CLASS/img_NNN.jpg, COUNT images of SIZE x SIZE per class. A class is a hue (degrees, given with its
// name, so that a class looks the same in every folder whatever other classes sit beside it) under a random
// brightness ramp and per-pixel noise drawn from SEED, the class name and the image number: easy to learn,
// but no two images alike.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "io_testing.h"
#include "tensor/random.h"

namespace {

uint32_t name_hash(const std::string& s) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

// Fully saturated colour of hue `deg` at value 1, each channel in [0, 1].
void hue_rgb(double deg, double rgb[3]) {
  for (int c = 0; c < 3; ++c) {
    const double k = std::fmod(5.0 - 2.0 * c + deg / 60.0, 6.0);  // r: 5, g: 3, b: 1
    rgb[c] = 1.0 - std::max(0.0, std::min({k, 4.0 - k, 1.0}));
  }
}

cz::Image class_image(int64_t size, double hue, uint32_t seed, uint32_t name, uint32_t index) {
  cz::Image img{size, size, std::vector<uint8_t>(size_t(size * size * 3))};
  double rgb[3];
  hue_rgb(hue, rgb);
  const auto r = cz::philox4x32(seed ^ name, index);
  const double base = 0.55 + 0.35 * (r[0] % 1000) / 1000.0, slope = ((r[1] % 1000) / 1000.0 - 0.5) * 0.4;
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x) {
      const auto noise = cz::philox4x32(r[2] ^ name, uint32_t(y * size + x) + (index << 20));
      const double level = base + slope * double(x + y) / double(2 * size);
      for (int c = 0; c < 3; ++c) {
        const double v = 255.0 * level * (0.15 + 0.85 * rgb[c]) + double(int(noise[c] % 41) - 20);
        img.pixels[size_t((y * size + x) * 3 + c)] = uint8_t(std::lround(std::clamp(v, 0.0, 255.0)));
      }
    }
  return img;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: make_image_folder DIR SIZE COUNT SEED CLASS=HUE [CLASS=HUE ...]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t size = std::atoll(argv[2]), count = std::atoll(argv[3]);
  const uint32_t seed = uint32_t(std::strtoul(argv[4], nullptr, 10));
  try {
    for (int a = 5; a < argc; ++a) {
      const std::string arg = argv[a];
      const size_t eq = arg.find('=');
      if (eq == std::string::npos || size <= 0 || count <= 0) {
        std::fprintf(stderr, "make_image_folder: bad argument '%s'\n", argv[a]);
        return 2;
      }
      const std::string name = arg.substr(0, eq);
      const double hue = std::atof(arg.c_str() + eq + 1);
      std::filesystem::create_directories(std::filesystem::path(dir) / name);
      for (int64_t i = 0; i < count; ++i)
        cz::testing::write_bytes(
            fmt::format("{}/{}/img_{:03d}.jpg", dir, name, i),
            cz::testing::encode_jpeg(class_image(size, hue, seed, name_hash(name), uint32_t(i))));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_image_folder: %s\n", e.what());
    return 1;
  }
  return 0;
}
