// --dump-batches FILE.png: the first batch as a grid of pictures, each with its target written below it in a
// 3x5-pixel font (digits, '.', ':'), so a recipe's augmentation and mixing can be looked at.
#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "io/data/batch_dump.h"

namespace cz {
namespace {

// Rows of 3 bits, the left pixel in the high bit: '0'-'9', then '.', ':'.
constexpr uint8_t kGlyphs[12][5] = {
    {7, 5, 5, 5, 7}, {2, 6, 2, 2, 7}, {7, 1, 7, 4, 7}, {7, 1, 7, 1, 7}, {5, 5, 7, 1, 1}, {7, 4, 7, 1, 7},
    {7, 4, 7, 5, 7}, {7, 1, 1, 1, 1}, {7, 5, 7, 5, 7}, {7, 5, 7, 1, 7}, {0, 0, 0, 0, 2}, {0, 2, 0, 2, 0},
};

struct Canvas {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
  void set(int64_t x, int64_t y, uint8_t r, uint8_t g, uint8_t b) {
    if (x < 0 || y < 0 || x >= width || y >= height) return;
    uint8_t* p = rgb.data() + (y * width + x) * 3;
    p[0] = r, p[1] = g, p[2] = b;
  }
  // Text at (x, y), each font pixel a scale x scale square; characters other than the glyphs' are spaces.
  void text(int64_t x, int64_t y, const std::string& s, int64_t scale) {
    for (char ch : s) {
      const int g = ch >= '0' && ch <= '9' ? ch - '0' : ch == '.' ? 10 : ch == ':' ? 11 : -1;
      for (int row = 0; g >= 0 && row < 5; ++row)
        for (int col = 0; col < 3; ++col)
          if (kGlyphs[g][row] & (4 >> col))
            for (int64_t dy = 0; dy < scale; ++dy)
              for (int64_t dx = 0; dx < scale; ++dx)
                set(x + col * scale + dx, y + row * scale + dy, 255, 255, 255);
      x += 4 * scale;
    }
  }
};

// The lines written under an image: its class, or each class whose target is above the row's smallest value
// (the smoothing's floor) with its weight, largest first, at most two.
std::vector<std::string> target_lines(int64_t i, const std::vector<int64_t>& labels,
                                      const std::vector<float>& t, int64_t k) {
  if (t.empty()) return {std::to_string(labels[size_t(i)])};
  const float* row = t.data() + i * k;
  const float floor = *std::min_element(row, row + k);
  std::vector<int64_t> order(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) order[size_t(c)] = c;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  std::vector<std::string> lines;
  for (size_t j = 0; j < order.size() && lines.size() < 2; ++j) {
    const int64_t c = order[j];
    if (row[c] <= floor && !lines.empty()) break;
    char buf[48];
    std::snprintf(buf, sizeof buf, "%lld:%.2f", static_cast<long long>(c), double(row[c]));
    lines.emplace_back(buf);
  }
  return lines;
}

}  // namespace

void write_batch_png(const std::string& path, const Tensor& images, const Tensor& labels,
                     const Tensor& targets) {
  const int64_t n = images.size(0), s = images.size(1);
  CZ_CHECK(n > 0, "--dump-batches {}: the first batch is empty", path);
  const int64_t cols = int64_t(std::ceil(std::sqrt(double(n)))), rows = (n + cols - 1) / cols;
  const int64_t scale = std::max<int64_t>(1, s / 64), line = 6 * scale, pad = 2 * scale;
  const int64_t cell_w = s + pad, cell_h = s + 2 * line + 2 * pad;
  Canvas c;
  c.width = cols * cell_w + pad;
  c.height = rows * cell_h + pad;
  c.rgb.assign(size_t(c.width * c.height * 3), 0);
  const std::vector<float> px = images.contiguous().to_vector<float>();
  const std::vector<int64_t> y = labels.to_vector<int64_t>();
  const std::vector<float> t =
      targets.defined() ? targets.contiguous().to_vector<float>() : std::vector<float>();
  const int64_t k = targets.defined() ? targets.size(1) : 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t x0 = pad + (i % cols) * cell_w, y0 = pad + (i / cols) * cell_h;
    for (int64_t yy = 0; yy < s; ++yy)
      for (int64_t xx = 0; xx < s; ++xx) {
        uint8_t v[3];
        for (int ch = 0; ch < 3; ++ch) {
          const double u =
              px[size_t(((i * s + yy) * s + xx) * 3 + ch)] * kImageNetStd[ch] + kImageNetMean[ch];
          v[ch] = uint8_t(std::lround(std::clamp(u, 0.0, 1.0) * 255.0));
        }
        c.set(x0 + xx, y0 + yy, v[0], v[1], v[2]);
      }
    const std::vector<std::string> lines = target_lines(i, y, t, k);
    for (size_t l = 0; l < lines.size(); ++l) c.text(x0, y0 + s + pad + int64_t(l) * line, lines[l], scale);
  }
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = png_uint_32(c.width);
  img.height = png_uint_32(c.height);
  img.format = PNG_FORMAT_RGB;
  // Written beside the target and renamed, so that a failed write never leaves a half picture under its name.
  const std::string temp = path + ".tmp";
  const bool ok = png_image_write_to_file(&img, temp.c_str(), 0, c.rgb.data(), 0, nullptr) != 0;
  const std::string why = ok ? "" : img.message;
  png_image_free(&img);
  if (!ok) ::unlink(temp.c_str());
  CZ_CHECK_IO(ok, "--dump-batches {}: cannot write the picture: {}", path, why);
  CZ_CHECK_IO(std::rename(temp.c_str(), path.c_str()) == 0, "--dump-batches {}: cannot rename {} to it: {}",
              path, temp, std::strerror(errno));
}

}  // namespace cz
