// Geometry and per-thread phases of the tiled 7x7 depthwise kernels (depthwise.cu), as host/device templates:
// the kernels call them with CUDA's types, and tests/tensor/test_depthwise_tiles.cpp runs the same code on
// the CPU, one "thread" after another and phase after phase, so the tiling arithmetic is checked without a
// GPU. Plain C++ apart from CZ_HD: no CUDA header is needed to include it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CZ_HD __host__ __device__ __forceinline__
#define CZ_UNROLL _Pragma("unroll")
#else
#define CZ_HD inline
#define CZ_UNROLL
#endif

namespace cz::cuda::dw7 {

// Note [Tiled depthwise kernels]: ConvNeXt's depthwise convolution is 7x7, stride 1, padding 3, NHWC, with
// the (7, 7, C) weight. Three kernels, each a pure function of its arguments:
// - forward (y = x * w + b) and, with the weight flipped, backward-data (dx = gy * flip(w)): a block owns a
//   tile of output pixels of `ni` images and 32 channels (one per lane). It stages its 32 channels' weights
//   (f32) and the tile plus a 3-pixel halo of its input into shared memory, the input in the data's own dtype
//   (16-byte loads along C where C is a multiple of 16 / sizeof(T) and the pointer is aligned, else element
//   by element; zeros outside the image), then every warp computes one strip of 4 rows x 7 columns of
//   outputs for its 32 channels: each thread holds its channel's 49 weights and 28 f32 accumulators in
//   registers and reads the 10 x 13 staged inputs of its strip once, each value feeding up to 28 FMAs (the
//   register blocking: 130 shared loads for 1372 FMAs). A 7 x 7 strip would read fewer (169 for 2401) but
//   needs 98 registers for weights and accumulators alone and spills at the 128 that two blocks per SM allow.
// - backward (dx, dw and db from one pass over the tiles): a block owns one tile and 32 channels and loops
//   over a fixed subset of the images; per image it stages the tile of gy with its halo, computes dx from it
//   as above, keeps its strip's 28 gy values in registers, then stages the tile of x with its halo and adds
//   gy * x into its 49 weight-gradient sums (and gy into the bias-gradient sum), kept between images in
//   shared memory, one slot per thread. At the end the block adds its warps' sums in warp order and writes
//   one partial per (tile, image subset): no floating-point atomics. gy is read once for dx, dw and db.
// - finish: dw[t, c] and db[c] are the partials added in partial order.
// Every summation order is fixed by the geometry, which depends on (N, H, W, C), the dtype's size and the
// SM count only: the results repeat bit for bit on the same GPU model. ConvNeXt's widths at 224 px (56, 28,
// 14, 7) are multiples of the strip's 7 columns and its heights 56 and 28 of its 4 rows; at 14 and 7 rows a
// strip computes 2 and 1 rows below the image (12.5% of those stages' FMAs), which is what the smaller strip
// costs.
inline constexpr int kK = 7;              // kernel size
inline constexpr int kPad = 3;            // padding
inline constexpr int kTaps = kK * kK;     // 49
inline constexpr int kSlots = kTaps + 1;  // weight-gradient taps + the bias gradient
inline constexpr int kRH = 4;             // outputs per thread: a kRH x kRW strip
inline constexpr int kRW = 7;
inline constexpr int kInH = kRH + kK - 1;  // 10 x 13 staged inputs a strip reads
inline constexpr int kInW = kRW + kK - 1;
inline constexpr int kLanes = 32;              // channels per block, one per lane
inline constexpr int kForwardWarps = 8;        // strips per forward block (at most)
inline constexpr int kBackwardWarps = 4;       // strips per backward block (at most)
inline constexpr int64_t kSmemCap = 96 << 10;  // bytes of shared memory per block (sm_86+ allow 99 KiB)

struct Geometry {
  int64_t n = 0, h = 0, w = 0, c = 0;
  int ni = 1;  // images per block
  int sh = 1;  // strips per tile down
  int sw = 1;  // strips per tile across
  int64_t tiles_h = 0, tiles_w = 0;
  int64_t batches = 0;  // groups of ni images
  int64_t cgroups = 0;  // groups of kLanes channels
  int64_t nz = 1;       // backward: blocks sharing the batches of one tile (block z takes z, z + nz, ...)

  CZ_HD int th() const { return sh * kRH; }
  CZ_HD int tw() const { return sw * kRW; }
  CZ_HD int sth() const { return th() + kK - 1; }  // staged rows of one image
  CZ_HD int stw() const { return tw() + kK - 1; }
  CZ_HD int strips() const { return ni * sh * sw; }
  CZ_HD int threads() const { return kLanes * strips(); }
  CZ_HD int64_t tiles() const { return tiles_h * tiles_w; }
  CZ_HD int64_t staged_pixels() const { return int64_t(ni) * sth() * stw(); }
  // Backward: how many partial sums per (tap, channel) the blocks write.
  CZ_HD int64_t partials() const { return tiles() * nz; }
};

CZ_HD int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Shared memory of one block: the block's 49 x 32 weights in f32 (flipped for backward-data), the staged
// tiles (in the data's dtype) and, for the backward kernel, kSlots f32 sums per thread.
inline constexpr int64_t kWeightBytes = int64_t(kTaps) * kLanes * sizeof(float);
CZ_HD int64_t staged_bytes(const Geometry& g, int elem_bytes) {
  return ceil_div(g.staged_pixels() * kLanes * elem_bytes, 16) * 16;
}
CZ_HD int64_t forward_smem(const Geometry& g, int elem_bytes) {
  return kWeightBytes + staged_bytes(g, elem_bytes);
}
CZ_HD int64_t backward_smem(const Geometry& g, int elem_bytes) {
  return forward_smem(g, elem_bytes) + int64_t(kSlots) * g.threads() * int64_t(sizeof(float));
}

// The launch geometry (host). The tile is the sh x sw strips that use the most of the block's warps with the
// fewest staged pixels per output (halo included); what warps are left take further images (small images),
// as many as fit kSmemCap. Backward blocks have fewer warps (they keep more in shared memory) and are spread
// over about 4 blocks per SM, each taking every nz-th batch of images of its tile.
inline Geometry plan(int64_t n, int64_t h, int64_t w, int64_t c, int elem_bytes, bool backward,
                     int sm_count) {
  Geometry g;
  g.n = n, g.h = h, g.w = w, g.c = c;
  const int max_warps = backward ? kBackwardWarps : kForwardWarps;
  const int64_t rows = ceil_div(h > 0 ? h : 1, kRH), cols = ceil_div(w > 0 ? w : 1, kRW);
  int best_strips = 0;
  double best_ratio = 0;
  for (int sh = 1; sh <= max_warps && sh <= rows; ++sh)
    for (int sw = 1; sh * sw <= max_warps && sw <= cols; ++sw) {
      const double ratio = double((sh * kRH + kK - 1) * (sw * kRW + kK - 1)) / double(sh * sw * kRH * kRW);
      if (sh * sw > best_strips || (sh * sw == best_strips && ratio < best_ratio)) {
        best_strips = sh * sw;
        best_ratio = ratio;
        g.sh = sh;
        g.sw = sw;
      }
    }
  g.ni = max_warps / (g.sh * g.sw);
  if (g.ni > n) g.ni = n > 0 ? int(n) : 1;
  auto smem = [&] { return backward ? backward_smem(g, elem_bytes) : forward_smem(g, elem_bytes); };
  while (g.ni > 1 && smem() > kSmemCap) --g.ni;
  g.tiles_h = ceil_div(h, g.th());
  g.tiles_w = ceil_div(w, g.tw());
  g.batches = ceil_div(n, g.ni);
  g.cgroups = ceil_div(c, kLanes);
  if (backward) {
    const int64_t per_wave = g.tiles() * g.cgroups, target = 4 * int64_t(sm_count > 0 ? sm_count : 1);
    g.nz = ceil_div(target, per_wave > 0 ? per_wave : 1);
    if (g.nz > g.batches) g.nz = g.batches;
    if (g.nz < 1) g.nz = 1;
  }
  return g;
}

// Whether a launch of this geometry fits CUDA's grid limits (gridDim.x < 2^31, gridDim.y < 2^16).
inline bool fits_grid(const Geometry& g, bool backward) {
  const int64_t x = backward ? g.tiles() * g.nz : g.batches * g.tiles();
  return x > 0 && x <= 0x7fffffff && g.cgroups > 0 && g.cgroups <= 65535;
}

// Where a block works: images [batch * ni, batch * ni + ni), the tile whose top-left output is (h0, w0), the
// channels [c0, c0 + kLanes).
struct Block {
  int64_t batch, h0, w0, c0;
};

CZ_HD Block tile_block(const Geometry& g, int64_t batch, int64_t tile, int64_t cgroup) {
  return {batch, (tile / g.tiles_w) * g.th(), (tile % g.tiles_w) * g.tw(), cgroup * kLanes};
}
// Forward grid: x = batch * tiles + tile, y = channel group.
CZ_HD Block forward_block(const Geometry& g, int64_t bx, int64_t by) {
  return tile_block(g, bx / g.tiles(), bx % g.tiles(), by);
}

// The strip a warp computes: its image slot in the block and its top-left output within the tile.
struct Strip {
  int slot, oh, ow;
};
CZ_HD Strip strip_of(const Geometry& g, int warp) {
  const int per = g.sh * g.sw, rem = warp % per;
  return {warp / per, (rem / g.sw) * kRH, (rem % g.sw) * kRW};
}
// Whether any output of the strip lies in the image (the others are staged and skipped).
CZ_HD bool strip_live(const Geometry& g, const Block& b, const Strip& s) {
  return b.batch * g.ni + s.slot < g.n && b.h0 + s.oh < g.h && b.w0 + s.ow < g.w;
}
// The staged element of a lane at row r, column q of a strip's 13 x 13 window (input pixel
// (h0 + oh + r - 3, w0 + ow + q - 3)) is window[r * row_stride(g) + q * kLanes], window = buf +
// window_offset(...). Shared-memory offsets fit an int (kSmemCap).
CZ_HD int window_offset(const Geometry& g, const Strip& s, int lane) {
  return ((s.slot * g.sth() + s.oh) * g.stw() + s.ow) * kLanes + lane;
}
CZ_HD int row_stride(const Geometry& g) {
  return g.stw() * kLanes;
}

CZ_HD float fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// 16 bytes from src to dst, both 16-byte aligned.
template <class T>
CZ_HD void copy16(const T* src, T* dst) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(dst) = __ldg(reinterpret_cast<const uint4*>(src));
#else
  std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), 16);
#endif
}

// Elements of T per 16-byte vector.
template <class T>
inline constexpr int kVec = int(16 / sizeof(T));

// Whether the 16-byte path may read `p`: C a multiple of the vector width and p 16-byte aligned (then every
// pixel's channel groups are).
template <class T>
inline bool vector_ok(const T* p, int64_t c) {
  return c % kVec<T> == 0 && (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Phase 1 of every block, part one: the weights of channels [c0, c0 + 32) into wsm[tap][lane] in f32 (zeros
// beyond C; kFlip: tap t takes weight 48 - t). Read from shared memory with constant offsets, they cost no
// address registers, where 49 pointers into the weight would (and the compiler hoists them out of the
// backward kernel's image loop, which then spills).
template <class T, class Cvt, bool kFlip>
CZ_HD void stage_weights(const T* __restrict__ wt, const Geometry& g, const Block& b, float* __restrict__ wsm,
                         int tid) {
  for (int k = tid; k < kTaps * kLanes; k += g.threads()) {
    const int t = k / kLanes;
    const int64_t c = b.c0 + k % kLanes;
    wsm[k] = c < g.c ? Cvt::in(wt[int64_t(kFlip ? kTaps - 1 - t : t) * g.c + c]) : 0.f;
  }
}

// Phase 1 of every block, part two: src's pixels of the block's images around its tile, channels [c0, c0 +
// 32), into buf[slot][row][col][lane] (the dtype of src; zeros outside the images and beyond C). Thread `tid`
// of g.threads() takes every threads()-th 16-byte group, so consecutive threads read consecutive bytes of a
// pixel. Cvt::template out<T>(0.f) is T's zero.
template <class T, class Cvt>
CZ_HD void stage(const T* __restrict__ src, const Geometry& g, const Block& b, bool vec, T* __restrict__ buf,
                 int tid) {
  constexpr int V = kVec<T>, kGroups = kLanes / V;
  const T zero = Cvt::template out<T>(0.f);
  // Thread tid takes 16-byte group tid % kGroups of pixels tid / kGroups, tid / kGroups + step, ...; the
  // pixel's (slot, row, column) advance by step without a division per pixel.
  const int grp = tid % kGroups, step = g.threads() / kGroups, sth = g.sth(), stw = g.stw();
  const int step_r = step / stw, step_c = step % stw;
  int p = tid / kGroups, slot = 0, sr = p / stw, sc = p % stw;
  while (sr >= sth) sr -= sth, ++slot;
  const int64_t cc = b.c0 + grp * V;
  for (; slot < g.ni; p += step) {
    const int64_t img = b.batch * g.ni + slot, hh = b.h0 - kPad + sr, ww = b.w0 - kPad + sc;
    T* dst = buf + p * kLanes + grp * V;
    if (img < g.n && hh >= 0 && hh < g.h && ww >= 0 && ww < g.w && cc < g.c) {
      const T* s = src + ((img * g.h + hh) * g.w + ww) * g.c + cc;
      if (vec) {
        copy16(s, dst);
      } else {
        CZ_UNROLL
        for (int e = 0; e < V; ++e) dst[e] = cc + e < g.c ? s[e] : zero;
      }
    } else {
      CZ_UNROLL
      for (int e = 0; e < V; ++e) dst[e] = zero;
    }
    sr += step_r, sc += step_c;
    if (sc >= stw) sc -= stw, ++sr;
    while (sr >= sth) sr -= sth, ++slot;
  }
}

// Phase 2 of the forward and backward-data kernels: the warp's strip of out for its lane's channel, from the
// staged input and weights (flipped in both directions: the input gradient from staged gy). bias may be
// null. Threads of dead strips or channels beyond C return at once.
template <class T, class Cvt>
CZ_HD void forward_strip(const Geometry& g, const Block& b, const T* __restrict__ buf,
                         const float* __restrict__ wsm, const T* __restrict__ bias, T* __restrict__ out,
                         int tid) {
  const int lane = tid % kLanes;
  const Strip s = strip_of(g, tid / kLanes);
  const int64_t c = b.c0 + lane;
  if (!strip_live(g, b, s) || c >= g.c) return;
  float wr[kTaps];
  CZ_UNROLL
  for (int t = 0; t < kTaps; ++t) wr[t] = wsm[t * kLanes + lane];
  float acc[kRH][kRW];
  CZ_UNROLL
  for (int o = 0; o < kRH; ++o) CZ_UNROLL
  for (int x = 0; x < kRW; ++x) acc[o][x] = 0.f;
  const T* window = buf + window_offset(g, s, lane);
  const int stride = row_stride(g);
  // Each staged value once, into every output of the strip it reaches: output (o, x) takes input (o + i,
  // x + j) with tap (i, j), so input (r, q) meets tap (r - o, q - x).
  CZ_UNROLL
  for (int r = 0; r < kInH; ++r) CZ_UNROLL
  for (int q = 0; q < kInW; ++q) {
    const float v = Cvt::in(window[r * stride + q * kLanes]);
    CZ_UNROLL
    for (int i = 0; i < kK; ++i) CZ_UNROLL
    for (int j = 0; j < kK; ++j) {
      const int o = r - i, x = q - j;
      if (o >= 0 && o < kRH && x >= 0 && x < kRW) acc[o][x] = fma_f32(v, wr[i * kK + j], acc[o][x]);
    }
  }
  // The rows and columns of the strip inside the image, then pointer steps (no 64-bit products per store).
  const float bv = bias ? Cvt::in(bias[c]) : 0.f;
  const int64_t h0 = b.h0 + s.oh, w0 = b.w0 + s.ow;
  const int rows = g.h - h0 < kRH ? int(g.h - h0) : kRH, cols = g.w - w0 < kRW ? int(g.w - w0) : kRW;
  T* row = out + (((b.batch * g.ni + s.slot) * g.h + h0) * g.w + w0) * g.c + c;
  CZ_UNROLL
  for (int o = 0; o < kRH; ++o) {
    T* p = row;
    CZ_UNROLL
    for (int x = 0; x < kRW; ++x) {
      if (o < rows && x < cols) *p = Cvt::template out<T>(acc[o][x] + bv);
      p += g.c;
    }
    row += g.w * g.c;
  }
}

// ---- backward ----

// Backward grid: x = z * tiles + tile, y = channel group; block z takes batches z, z + nz, ... of its tile.
CZ_HD int64_t backward_tile(const Geometry& g, int64_t bx) {
  return bx % g.tiles();
}
CZ_HD int64_t backward_z(const Geometry& g, int64_t bx) {
  return bx / g.tiles();
}

// What a thread carries from the staged gy to the staged x: its strip's gy (zeros outside the image).
struct GyStrip {
  float g[kRH][kRW];
};

// The thread's kSlots sums live in sums[slot * threads + tid] (shared memory between images).
CZ_HD void zero_sums(const Geometry& g, float* sums, int tid) {
  for (int t = 0; t < kSlots; ++t) sums[t * g.threads() + tid] = 0.f;
}

// After staging gy: the strip's gy (the centre of the staged window) into registers.
template <class T, class Cvt>
CZ_HD void load_gy(const Geometry& g, const Block& b, const T* __restrict__ buf, GyStrip& gy, int tid) {
  const Strip s = strip_of(g, tid / kLanes);
  const T* window = buf + window_offset(g, s, tid % kLanes);
  const int stride = row_stride(g);
  CZ_UNROLL
  for (int o = 0; o < kRH; ++o) CZ_UNROLL
  for (int x = 0; x < kRW; ++x) gy.g[o][x] = Cvt::in(window[(o + kPad) * stride + (x + kPad) * kLanes]);
}

// After staging x: sums[tap (i, j)] += sum over the strip of gy(o, x) * x(o + i - 3, x + j - 3), and
// sums[49] += sum of gy, each staged x value read once (input (r, q) meets tap (r - o, q - x) as in
// forward_strip). Zeros staged outside the image and beyond C make every term there zero.
template <class T, class Cvt>
CZ_HD void accumulate_filter(const Geometry& g, const Block& b, const T* __restrict__ buf, const GyStrip& gy,
                             float* sums, int tid) {
  const Strip s = strip_of(g, tid / kLanes);
  if (!strip_live(g, b, s)) return;
  float a[kSlots];
  CZ_UNROLL
  for (int t = 0; t < kSlots; ++t) a[t] = sums[t * g.threads() + tid];
  const T* window = buf + window_offset(g, s, tid % kLanes);
  const int stride = row_stride(g);
  CZ_UNROLL
  for (int r = 0; r < kInH; ++r) CZ_UNROLL
  for (int q = 0; q < kInW; ++q) {
    const float v = Cvt::in(window[r * stride + q * kLanes]);
    CZ_UNROLL
    for (int i = 0; i < kK; ++i) CZ_UNROLL
    for (int j = 0; j < kK; ++j) {
      const int o = r - i, x = q - j;
      if (o >= 0 && o < kRH && x >= 0 && x < kRW) a[i * kK + j] = fma_f32(gy.g[o][x], v, a[i * kK + j]);
    }
  }
  CZ_UNROLL
  for (int o = 0; o < kRH; ++o) CZ_UNROLL
  for (int x = 0; x < kRW; ++x) a[kTaps] += gy.g[o][x];
  CZ_UNROLL
  for (int t = 0; t < kSlots; ++t) sums[t * g.threads() + tid] = a[t];
}

// Last phase: the block's partial for (tap or bias slot t, channel c) is the sum of its warps' sums in warp
// order, written to partial[(q * kSlots + t) * C + c] with q = tile * nz + z.
CZ_HD void write_partial(const Geometry& g, const Block& b, int64_t q, const float* sums, float* partial,
                         int tid) {
  for (int k = tid; k < kSlots * kLanes; k += g.threads()) {
    const int t = k / kLanes, lane = k % kLanes;
    float acc = 0.f;
    for (int w = 0; w < g.strips(); ++w) acc += sums[t * g.threads() + w * kLanes + lane];
    if (b.c0 + lane < g.c) partial[(q * kSlots + t) * g.c + b.c0 + lane] = acc;
  }
}

// The finishing pass, item i of kSlots * C: the partials of (tap or bias slot, channel) added in partial
// order; taps to dw (7, 7, C), the bias slot to db (C). Either may be null.
template <class T, class Cvt>
CZ_HD void finish_item(const Geometry& g, const float* __restrict__ partial, T* __restrict__ dw,
                       T* __restrict__ db, int64_t i) {
  const int64_t t = i / g.c, c = i % g.c;
  float acc = 0.f;
  for (int64_t q = 0; q < g.partials(); ++q) acc += partial[(q * kSlots + t) * g.c + c];
  if (t < kTaps) {
    if (dw) dw[t * g.c + c] = Cvt::template out<T>(acc);
  } else if (db) {
    db[c] = Cvt::template out<T>(acc);
  }
}

}  // namespace cz::cuda::dw7
