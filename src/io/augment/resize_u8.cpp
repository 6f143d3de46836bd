// The 8-bit crop + resize + flip of Note [8-bit resize] (image_transform.h), with PIL's arithmetic, and the
// normalisation of an 8-bit image. Compiled with -ffp-contract=off, like the RandAugment ops: the fixed-point
// coefficients come from doubles rounded at each step as PIL's C does.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "io/augment/image_transform.h"
#include "io/augment/resize_u8_kernels.h"
#include "io/image/image.h"
#include "tensor/check.h"

namespace cz {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's: 8 bits of result, 2 for overshoot and sign

double pil_filter(Interpolation interpolation, double x) {
  if (x < 0.0) x = -x;
  if (interpolation == Interpolation::bilinear) return x < 1.0 ? 1.0 - x : 0.0;
  constexpr double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One output coordinate's taps: source pixels [first, first + k.size()) of the cropped axis.
struct FixedTaps {
  int64_t first = 0;
  std::vector<int32_t> k;
};

// PIL's precompute_coeffs + normalize_coeffs_8bpc for an axis of `in` pixels resized to `out` (the crop is
// the whole input, as torchvision crops before resizing).
std::vector<FixedTaps> fixed_taps(int64_t in, int64_t out, Interpolation interpolation) {
  const double scale = double(in) / double(out);
  const double filterscale = std::max(scale, 1.0);
  const double support = (interpolation == Interpolation::bilinear ? 1.0 : 2.0) * filterscale;
  const double inv_filterscale = 1.0 / filterscale;
  std::vector<FixedTaps> taps(static_cast<size_t>(out));
  std::vector<double> w;
  for (int64_t xx = 0; xx < out; ++xx) {
    const double center = (double(xx) + 0.5) * scale;
    const int64_t xmin = std::max<int64_t>(0, int64_t(center - support + 0.5));
    const int64_t xmax = std::min<int64_t>(in, int64_t(center + support + 0.5)) - xmin;
    w.assign(size_t(std::max<int64_t>(xmax, 0)), 0.0);
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      w[size_t(x)] = pil_filter(interpolation, (double(x + xmin) - center + 0.5) * inv_filterscale);
      ww += w[size_t(x)];
    }
    FixedTaps& t = taps[size_t(xx)];
    t.first = xmin;
    for (double v : w) {
      if (ww != 0.0) v /= ww;
      t.k.push_back(v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits))
                          : int32_t(0.5 + v * (1 << kPrecisionBits)));
    }
  }
  return taps;
}

uint8_t clip8(int32_t ss) {
  return uint8_t(std::clamp<int32_t>(ss >> kPrecisionBits, 0, 255));  // arithmetic shift: floor
}

// PIL sums in 32-bit ints: 8-bit values times coefficients of 22 bits whose absolute values add up to at
// most about 1.14 (the bicubic's negative lobes) stay below 2^31, and integer sums are exact in any order,
// so the loops below may run over the taps in whatever order is fastest.

// One horizontal pass: `rows` rows of `in` (pixels `stride` bytes apart row to row) resampled by `taps` into
// `out`, taps.size() pixels per row, rounded to 8 bits.
void horizontal_pass(const uint8_t* in, int64_t stride, int64_t rows, const std::vector<FixedTaps>& taps,
                     uint8_t* out) {
  const int64_t width = int64_t(taps.size());
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* r = in + y * stride;
    uint8_t* o = out + y * width * 3;
    for (int64_t xx = 0; xx < width; ++xx) {
      const FixedTaps& t = taps[size_t(xx)];
      const uint8_t* p = r + t.first * 3;
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (const int32_t k : t.k) {
        s0 += int32_t(p[0]) * k, s1 += int32_t(p[1]) * k, s2 += int32_t(p[2]) * k;
        p += 3;
      }
      o[xx * 3] = clip8(s0), o[xx * 3 + 1] = clip8(s1), o[xx * 3 + 2] = clip8(s2);
    }
  }
}

// One vertical pass: `width` pixels of each of taps.size() output rows from the rows of `in` (`stride` bytes
// apart), rounded to 8 bits; whole rows at a time, accumulated in `acc`.
void vertical_pass(const uint8_t* in, int64_t stride, int64_t width, const std::vector<FixedTaps>& taps,
                   uint8_t* out) {
  const int64_t n = width * 3;
  std::vector<int32_t> acc(static_cast<size_t>(n));
  for (size_t yy = 0; yy < taps.size(); ++yy) {
    const FixedTaps& t = taps[yy];
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    for (size_t y = 0; y < t.k.size(); ++y) {
      const uint8_t* r = in + (t.first + int64_t(y)) * stride;
      const int32_t k = t.k[y];
      for (int64_t i = 0; i < n; ++i) acc[size_t(i)] += int32_t(r[i]) * k;
    }
    uint8_t* o = out + int64_t(yy) * n;
    for (int64_t i = 0; i < n; ++i) o[i] = clip8(acc[size_t(i)]);
  }
}

// The taps of fixed_taps as resize_u8_kernels.h's flat arrays.
struct FlatTaps {
  std::vector<int64_t> first;
  std::vector<int32_t> count, coeff;
  int64_t stride = 0;
  explicit FlatTaps(const std::vector<FixedTaps>& taps) {
    for (const FixedTaps& t : taps) stride = std::max<int64_t>(stride, int64_t(t.k.size()));
    coeff.assign(size_t(stride) * taps.size(), 0);
    for (size_t i = 0; i < taps.size(); ++i) {
      first.push_back(taps[i].first);
      count.push_back(int32_t(taps[i].k.size()));
      std::copy(taps[i].k.begin(), taps[i].k.end(), coeff.begin() + int64_t(i) * stride);
    }
  }
  AxisTapsView view() const {
    return {first.data(), count.data(), coeff.data(), stride, int64_t(first.size())};
  }
};

// (rows x cols) 3-byte pixels, `stride` bytes from row to row, into (cols x rows), packed: output row c is
// input column c; with `mirror`, output row c is written right to left (input row r lands in column
// rows-1-r). Pixels move as 4-byte words where the byte after the pixel may be read (not the input's last
// column) and written (not the output row's last pixel), the extra byte landing on the next pixel of the same
// output row, which the loops' order writes afterwards (rows ascending, or descending when mirrored).
void transpose_pixels(const uint8_t* in, int64_t stride, int64_t rows, int64_t cols, bool mirror,
                      uint8_t* out) {
  constexpr int64_t kBlock = 32;  // a block of rows and columns stays in the L1 cache both ways
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  for (int64_t bi = 0; bi < blocks; ++bi) {
    const int64_t r0 = (mirror ? blocks - 1 - bi : bi) * kBlock, r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c) {
        uint8_t* dst = out + c * rows * 3;
        const uint8_t* src = in + c * 3;
        for (int64_t i = r0; i < r1; ++i) {
          const int64_t r = mirror ? r1 - 1 - (i - r0) : i;
          const int64_t at = mirror ? rows - 1 - r : r;
          const uint8_t* p = src + r * stride;
          if (c + 1 < cols && at + 1 < rows) {
            std::memcpy(dst + at * 3, p, 4);
          } else {
            dst[at * 3] = p[0], dst[at * 3 + 1] = p[1], dst[at * 3 + 2] = p[2];
          }
        }
      }
    }
  }
}

// Note [8-bit resize] with a rows-pass kernel: the vertical pass is the kernel itself; the horizontal one is
// the kernel between two transposes (columns become rows, which the kernel sums whole and wide). The flip is
// fused into whichever pass writes `out` last. Same bytes as the scalar loops (integer sums in any order).
void resample_with_kernel(RowsPassFn rows_pass, const uint8_t* crop, int64_t stride, const CropBox& box,
                          int64_t size, Interpolation interpolation, bool horizontal_first, uint8_t* out,
                          ResampleScratch& scratch) {
  const bool horizontal = box.w != size, vertical = box.h != size;
  std::vector<int32_t>& acc = scratch.acc;
  std::vector<uint8_t>&t0 = scratch.t0, &t1 = scratch.t1, &mid = scratch.mid;
  // rows x in_w pixels at `src` -> rows x size at `dst`.
  auto horizontal_pass = [&](const uint8_t* src, int64_t src_stride, int64_t rows, int64_t in_w, bool flip,
                             uint8_t* dst) {
    const FlatTaps xs(fixed_taps(in_w, size, interpolation));
    t0.resize(size_t(in_w * rows * 3));
    transpose_pixels(src, src_stride, rows, in_w, false, t0.data());
    t1.resize(size_t(size * rows * 3));
    acc.resize(size_t(rows * 3));
    rows_pass(t0.data(), rows * 3, rows * 3, xs.view(), t1.data(), rows * 3, false, acc.data());
    transpose_pixels(t1.data(), rows * 3, size, rows, flip, dst);  // size x rows -> rows x size, flipped
  };
  // in_h x width pixels at `src` -> size x width at `dst`.
  auto vertical_pass = [&](const uint8_t* src, int64_t src_stride, int64_t in_h, int64_t width, bool flip,
                           uint8_t* dst) {
    const FlatTaps ys(fixed_taps(in_h, size, interpolation));
    acc.resize(size_t(width * 3));
    rows_pass(src, src_stride, width * 3, ys.view(), dst, width * 3, flip, acc.data());
  };
  if (horizontal && vertical) {
    if (horizontal_first) {
      mid.resize(size_t(box.h * size * 3));
      horizontal_pass(crop, stride, box.h, box.w, false, mid.data());
      vertical_pass(mid.data(), size * 3, box.h, size, box.flip, out);
    } else {
      mid.resize(size_t(size * box.w * 3));
      vertical_pass(crop, stride, box.h, box.w, false, mid.data());
      horizontal_pass(mid.data(), box.w * 3, size, box.w, box.flip, out);
    }
  } else if (horizontal) {
    horizontal_pass(crop, stride, size, box.w, box.flip, out);
  } else if (vertical) {
    vertical_pass(crop, stride, box.h, size, box.flip, out);
  } else {
    for (int64_t y = 0; y < size; ++y) {
      const uint8_t* src = crop + y * stride;
      uint8_t* dst = out + y * size * 3;
      for (int64_t x = 0; x < size; ++x) {
        const int64_t from = box.flip ? size - 1 - x : x;
        dst[x * 3] = src[from * 3], dst[x * 3 + 1] = src[from * 3 + 1], dst[x * 3 + 2] = src[from * 3 + 2];
      }
    }
  }
}

// The per-pixel loops (ResizeKernel::scalar): the reference the kernels are tested against.
void resample_scalar(const uint8_t* crop, int64_t stride, const CropBox& box, int64_t size,
                     Interpolation interpolation, bool vertical_first, uint8_t* out) {
  const bool horizontal = box.w != size, vertical = box.h != size;  // PIL skips a pass that changes nothing
  std::vector<uint8_t> tmp;
  if (horizontal && vertical) {
    const std::vector<FixedTaps> xs = fixed_taps(box.w, size, interpolation);
    const std::vector<FixedTaps> ys = fixed_taps(box.h, size, interpolation);
    if (vertical_first) {
      tmp.resize(size_t(size * box.w * 3));
      vertical_pass(crop, stride, box.w, ys, tmp.data());
      horizontal_pass(tmp.data(), box.w * 3, size, xs, out);
    } else {
      tmp.resize(size_t(box.h * size * 3));
      horizontal_pass(crop, stride, box.h, xs, tmp.data());
      vertical_pass(tmp.data(), size * 3, size, ys, out);
    }
  } else if (horizontal) {
    horizontal_pass(crop, stride, size, fixed_taps(box.w, size, interpolation), out);
  } else if (vertical) {
    vertical_pass(crop, stride, size, fixed_taps(box.h, size, interpolation), out);
  } else {
    for (int64_t y = 0; y < size; ++y) std::copy_n(crop + y * stride, size * 3, out + y * size * 3);
  }
  if (box.flip) {
    for (int64_t y = 0; y < size; ++y) {
      uint8_t* r = out + y * size * 3;
      for (int64_t a = 0, b = size - 1; a < b; ++a, --b)
        for (int c = 0; c < 3; ++c) std::swap(r[a * 3 + c], r[b * 3 + c]);
    }
  }
}

void resample_u8_with(const Image& src, const CropBox& box, int64_t size, Interpolation interpolation,
                      Image& out, ResizeKernel kernel, ResampleScratch& scratch) {
  out.height = out.width = size;
  out.pixels.resize(size_t(size * size * 3));
  const int64_t stride = src.width * 3;
  const uint8_t* crop = src.pixels.data() + box.y * stride + box.x * 3;
  // Pillow 13 runs the vertical pass first when the height shrinks by more than twice what the width does
  // (fewer rows for the horizontal pass); earlier versions always went horizontal first. The two orders
  // round differently in between, so the order is part of matching it.
  const bool vertical_first = box.h - size > 0 && box.h - size > (box.w - size) * 2;
  if (kernel == ResizeKernel::scalar)
    resample_scalar(crop, stride, box, size, interpolation, vertical_first, out.pixels.data());
  else
    resample_with_kernel(rows_pass_for(kernel), crop, stride, box, size, interpolation, !vertical_first,
                         out.pixels.data(), scratch);
}

}  // namespace

void resample_u8(const Image& src, const CropBox& box, int64_t size, Interpolation interpolation,
                 Image& out) {
  ResampleScratch scratch;
  resample_u8(src, box, size, interpolation, out, scratch);
}

void resample_u8(const Image& src, const CropBox& box, int64_t size, Interpolation interpolation, Image& out,
                 ResampleScratch& scratch) {
  static const ResizeKernel kernel = default_resize_kernel();
  resample_u8_with(src, box, size, interpolation, out, kernel, scratch);
}

void resample_u8(const Image& src, const CropBox& box, int64_t size, Interpolation interpolation, Image& out,
                 ResizeKernel kernel) {
  ResampleScratch scratch;
  resample_u8_with(src, box, size, interpolation, out, kernel, scratch);
}

void normalise_u8(const Image& img, float* out) {
  float mul[3], add[3];  // the multiply-add of resample_normalised
  for (int c = 0; c < 3; ++c) {
    mul[c] = 1.0f / (255.0f * kImageNetStd[c]);
    add[c] = -kImageNetMean[c] / kImageNetStd[c];
  }
  const int64_t n = img.height * img.width * 3;
  for (int64_t i = 0; i < n; ++i) out[i] = float(img.pixels[size_t(i)]) * mul[i % 3] + add[i % 3];
}

const char* resize_kernel_name(ResizeKernel kernel) {
  switch (kernel) {
    case ResizeKernel::scalar:
      return "scalar";
    case ResizeKernel::baseline:
      return "baseline";
    case ResizeKernel::avx2:
      return "avx2";
    case ResizeKernel::avx512:
      return "avx512";
  }
  return "?";
}

bool resize_kernel_runs_here(ResizeKernel kernel) {
  switch (kernel) {
    case ResizeKernel::scalar:
    case ResizeKernel::baseline:
      return true;
#if defined(CZ_RESIZE_X86_KERNELS)
    case ResizeKernel::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi2");
    case ResizeKernel::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512cd") && resize_kernel_runs_here(ResizeKernel::avx2);
#else
    default:
      return false;
#endif
  }
  return false;
}

ResizeKernel default_resize_kernel() {
  const ResizeKernel all[] = {ResizeKernel::scalar, ResizeKernel::baseline, ResizeKernel::avx2,
                              ResizeKernel::avx512};
  if (const char* env = std::getenv("CZ_RESIZE_KERNEL"); env != nullptr && *env != '\0') {
    for (ResizeKernel k : all)
      if (std::string(env) == resize_kernel_name(k)) {
        if (!resize_kernel_runs_here(k))
          throw ValueError(
              fmt::format("CZ_RESIZE_KERNEL={}: this CPU (or build) cannot run that kernel", env));
        return k;
      }
    throw ValueError(fmt::format("CZ_RESIZE_KERNEL must be scalar, baseline, avx2 or avx512, got '{}'", env));
  }
  for (ResizeKernel k : {ResizeKernel::avx512, ResizeKernel::avx2})
    if (resize_kernel_runs_here(k)) return k;
  return ResizeKernel::baseline;
}

RowsPassFn rows_pass_for(ResizeKernel kernel) {
  switch (kernel) {
    case ResizeKernel::scalar:
      return nullptr;
    case ResizeKernel::baseline:
      return resize_kernels::rows_pass_baseline;
#if defined(CZ_RESIZE_X86_KERNELS)
    case ResizeKernel::avx2:
      return resize_kernels::rows_pass_avx2;
    case ResizeKernel::avx512:
      return resize_kernels::rows_pass_avx512;
#else
    default:
      break;
#endif
  }
  CZ_CHECK(false, "rows_pass_for: the {} kernel is not compiled in", resize_kernel_name(kernel));
  return nullptr;
}

}  // namespace cz
