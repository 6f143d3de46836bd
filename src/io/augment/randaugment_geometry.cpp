// RandAugment's geometric ops as PIL's Image.transform(AFFINE) computes them (Note [PIL's arithmetic],
// randaugment_ops.h): an inverse map per output pixel, then PIL's bilinear or bicubic filter.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "io/augment/randaugment_ops.h"

namespace cz {
namespace {

int floor_int(double v) {
  return v < 0.0 ? int(std::floor(v)) : int(v);
}

int clip(int v, int64_t n) {
  return v < 0 ? 0 : v < n ? v : int(n - 1);
}

uint8_t truncate_clamped(double v) {
  return v <= 0.0 ? uint8_t(0) : v >= 255.0 ? uint8_t(255) : uint8_t(v);
}

// The source image as values the filters keep in registers: read through `img.pixels` and `img.width`, every
// byte stored into the output could (as far as the compiler knows) have changed them, so they were reloaded
// per pixel (Note [Byte loops through raw pointers], randaugment_colour.cpp). Same arithmetic, same bytes.
struct Source {
  const uint8_t* pixels;
  int64_t height, width;
};

// PIL's bilinear_filter32RGB at source point (xin, yin), already known to be inside the image: rows and
// columns clamped at the edges (a missing lower row repeats the upper one), the result truncated.
void bilinear(const Source img, double xin, double yin, uint8_t* __restrict out) {
  xin -= 0.5;
  yin -= 0.5;
  const int x = floor_int(xin), y = floor_int(yin);
  const double dx = xin - x, dy = yin - y;
  const uint8_t* r0 = img.pixels + int64_t(clip(y, img.height)) * img.width * 3;
  const bool has_r1 = y + 1 >= 0 && y + 1 < img.height;
  const uint8_t* r1 = img.pixels + int64_t(has_r1 ? y + 1 : 0) * img.width * 3;
  const int64_t x0 = int64_t(clip(x, img.width)) * 3, x1 = int64_t(clip(x + 1, img.width)) * 3;
  for (int c = 0; c < 3; ++c) {
    const double v1 = r0[x0 + c] + (r0[x1 + c] - r0[x0 + c]) * dx;
    const double v2 = has_r1 ? r1[x0 + c] + (r1[x1 + c] - r1[x0 + c]) * dx : v1;
    out[c] = uint8_t(v1 + (v2 - v1) * dy);
  }
}

// PIL's cubic through four samples (its BICUBIC macro: the a = -1 cubic convolution).
double cubic(double v1, double v2, double v3, double v4, double d) {
  const double p1 = v2, p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

// PIL's bicubic_filter32RGB: a 4x4 neighbourhood with columns clamped; the first row clamped, each missing
// later row repeating the one before; clamped to [0, 255] and truncated.
void bicubic(const Source img, double xin, double yin, uint8_t* __restrict out) {
  xin -= 0.5;
  yin -= 0.5;
  const int x = floor_int(xin) - 1, y = floor_int(yin) - 1;
  const double dx = xin - (x + 1), dy = yin - (y + 1);
  int64_t cols[4];
  for (int k = 0; k < 4; ++k) cols[k] = int64_t(clip(x + k, img.width)) * 3;
  // The four rows: the first clamped into the image; a later one outside it repeats the row before.
  const int64_t row = img.width * 3;
  const uint8_t* rows[4];
  rows[0] = img.pixels + int64_t(clip(y, img.height)) * row;
  for (int k = 1; k < 4; ++k) {
    const int yy = y + k;
    rows[k] = yy >= 0 && yy < img.height ? img.pixels + int64_t(yy) * row : nullptr;
  }
  for (int c = 0; c < 3; ++c) {
    double v[4];
    v[0] = cubic(rows[0][cols[0] + c], rows[0][cols[1] + c], rows[0][cols[2] + c], rows[0][cols[3] + c], dx);
    for (int k = 1; k < 4; ++k) {
      const uint8_t* r = rows[k];
      v[k] = r ? cubic(r[cols[0] + c], r[cols[1] + c], r[cols[2] + c], r[cols[3] + c], dx) : v[k - 1];
    }
    out[c] = truncate_clamped(cubic(v[0], v[1], v[2], v[3], dy));
  }
}

// Python's round(v, 15): the double nearest the decimal with 15 places nearest v. glibc's printf rounds the
// exact binary value correctly, as Python's dtoa does, and strtod reads it back correctly rounded.
double round15(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15f", v);
  return std::strtod(buf, nullptr);
}

// Exact rotations by 90 (square images only), 180 and 270 degrees counter-clockwise, as PIL's transposes.
void transpose_rotate(Image& img, int degrees) {
  const int64_t h = img.height, w = img.width;
  std::vector<uint8_t> out(img.pixels.size());
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      // Source of output pixel (y, x).
      const int64_t sy = degrees == 180 ? h - 1 - y : degrees == 90 ? x : w - 1 - x;
      const int64_t sx = degrees == 180 ? w - 1 - x : degrees == 90 ? w - 1 - y : y;
      for (int c = 0; c < 3; ++c)
        out[size_t((y * w + x) * 3 + c)] = img.pixels[size_t((sy * w + sx) * 3 + c)];
    }
  }
  img.pixels = std::move(out);
}

}  // namespace

void affine(Image& img, const std::array<double, 6>& m, Interpolation resample, Rgb fill) {
  const int64_t h = img.height, w = img.width;
  std::vector<uint8_t> out(img.pixels.size());
  uint8_t* __restrict o = out.data();
  const Source src{img.pixels.data(), h, w};
  const double m0 = m[0], m1 = m[1], m2 = m[2], m3 = m[3], m4 = m[4], m5 = m[5];
  const uint8_t f0 = fill[0], f1 = fill[1], f2 = fill[2];
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x, o += 3) {
      const double xo = double(x) + 0.5, yo = double(y) + 0.5;
      const double xin = m0 * xo + m1 * yo + m2;
      const double yin = m3 * xo + m4 * yo + m5;
      if (xin < 0.0 || xin >= double(w) || yin < 0.0 || yin >= double(h)) {
        o[0] = f0, o[1] = f1, o[2] = f2;
      } else if (resample == Interpolation::bicubic) {
        bicubic(src, xin, yin, o);
      } else {
        bilinear(src, xin, yin, o);
      }
    }
  }
  img.pixels = std::move(out);
}

void rotate(Image& img, double degrees, Interpolation resample, Rgb fill) {
  // Image.rotate(angle) without expand: angle % 360 (Python's, non-negative), the identity at 0; the inverse
  // rotation about the centre, its cos and sin rounded to 15 decimals as PIL does.
  double a = std::fmod(degrees, 360.0);
  if (a < 0) a += 360.0;
  if (a == 0.0) return;
  // PIL transposes at exactly 180, and at 90 and 270 when the image is square (timm reaches these only with
  // mmax above 10: its angle is magnitude / 10 * 30 degrees).
  if (a == 180.0 || ((a == 90.0 || a == 270.0) && img.width == img.height)) {
    transpose_rotate(img, int(a));
    return;
  }
  const double rad = -(a * (M_PI / 180.0));
  const double c = round15(std::cos(rad)), s = round15(std::sin(rad)), ms = round15(-std::sin(rad));
  const double cx = double(img.width) / 2, cy = double(img.height) / 2;
  std::array<double, 6> m{c, s, 0.0, ms, c, 0.0};
  m[2] = m[0] * -cx + m[1] * -cy + m[2] + cx;
  m[5] = m[3] * -cx + m[4] * -cy + m[5] + cy;
  affine(img, m, resample, fill);
}

void shear_x(Image& img, double factor, Interpolation resample, Rgb fill) {
  affine(img, {1, factor, 0, 0, 1, 0}, resample, fill);
}

void shear_y(Image& img, double factor, Interpolation resample, Rgb fill) {
  affine(img, {1, 0, 0, factor, 1, 0}, resample, fill);
}

void translate_x(Image& img, double pixels, Interpolation resample, Rgb fill) {
  affine(img, {1, 0, pixels, 0, 1, 0}, resample, fill);
}

void translate_y(Image& img, double pixels, Interpolation resample, Rgb fill) {
  affine(img, {1, 0, 0, 0, 1, pixels}, resample, fill);
}

}  // namespace cz
