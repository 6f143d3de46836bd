// Per-thread arithmetic of the GRN kernels (grn.cu) as host/device templates: the kernels call them with
// CUDA's types, and tests/tensor/test_grn_emulation.cpp runs the same code on the CPU thread by thread, in
// the kernels' reduction order, so the kernels' logic is checked without a GPU. Plain C++ apart from CZ_HD.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/cuda/host_device.h"

namespace cz::cuda::grn {

// Note [GRN kernels]
// x is (N, HW, C); every order below is fixed by the shape, so results repeat bit for bit (no atomics).
//  1. Per-image sums: a block per (image, tile of kCols channels) of kCols x kLanes threads. Thread (lane,
//     col) walks pixels lane, lane + kLanes, ... (a warp reads 32 consecutive channels of a pixel), then the
//     block's lane-0 thread adds the kLanes partials in lane order (add_lanes). Forward: gx = sqrt(sum x^2).
//     Backward: s = sum g x and sg = sum g, into a workspace.
//  2. Per image, one warp: lane l takes channels l, l + 32, ..., and the lanes' sums are added by butterfly
//     (lane l takes lane l ^ 16, ^ 8, ... ^ 1). Forward: d = sum_c gx / C + eps. Backward: m = sum_c a nx / C
//     with a = gamma s, then k = (a - m) / (d gx) per channel (0 where gx = 0), into the workspace.
//  3. Backward, one thread per channel: dgamma = sum_n nx s, dbeta = sum_n sg, images in order.
//  4. Elementwise (grid-stride): y = x + (beta + gamma (x nx)); dx = g (1 + gamma nx) + x k.
// nx = gx / d is recomputed wherever it is needed, from the saved gx and d.
inline constexpr int kCols = 32, kLanes = 8, kWarp = 32;

template <class A>
CZ_HD A sqrt_of(A v) {
#if defined(__CUDA_ARCH__)
  return sqrt(v);
#else
  return std::sqrt(v);
#endif
}

// Thread (lane, col)'s partial sums over the image's pixels (x, g: the image's first pixel; g null in
// forward): s = sum x^2 forward, s = sum g x and sg = sum g backward. Cvt::template to<A>(v) reads an element
// of the data's dtype as A.
template <class A, class T, class Cvt>
CZ_HD void lane_sums(const T* x, const T* g, int64_t hw, int64_t c, int64_t col, int lane, A& s, A& sg) {
  s = sg = A(0);
  for (int64_t p = lane; p < hw; p += kLanes) {
    const A xv = Cvt::template to<A>(x[p * c + col]);
    if (g) {
      const A gv = Cvt::template to<A>(g[p * c + col]);
      s += gv * xv;
      sg += gv;
    } else {
      s += xv * xv;
    }
  }
}

// The kLanes partials of a column (stride apart) in lane order.
template <class A>
CZ_HD A add_lanes(const A* part, int stride) {
  A t = part[0];
  for (int l = 1; l < kLanes; ++l) t += part[l * stride];
  return t;
}

// Lane `lane`'s share of a sum over the channels of v(c).
template <class A, class F>
CZ_HD A lane_channel_sum(int64_t c, int lane, F&& v) {
  A s = A(0);
  for (int64_t i = lane; i < c; i += kWarp) s += v(i);
  return s;
}

template <class A>
CZ_HD A nx_of(A gx, A d) {
  return gx / d;
}
template <class A>
CZ_HD A divisor_of(A gx_sum, int64_t c, A eps) {
  return gx_sum / A(c) + eps;
}
// The input gradient's factor k of a channel, a = gamma s, m = mean_c(a nx).
template <class A>
CZ_HD A k_of(A a, A m, A d, A gx) {
  return gx > A(0) ? (a - m) / (d * gx) : A(0);
}
template <class A>
CZ_HD A out_of(A x, A gamma, A beta, A nx) {
  return x + (beta + gamma * (x * nx));
}
template <class A>
CZ_HD A dx_of(A g, A x, A gamma, A nx, A k) {
  return g * (A(1) + gamma * nx) + x * k;
}

}  // namespace cz::cuda::grn
