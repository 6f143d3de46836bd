// The GRN kernels (grn.cu, Note [GRN kernels] in grn_threads.h) run on the CPU: every thread of every step
// through the same functions of grn_threads.h the kernels call, and the reductions in the kernels' order
// (lanes in order, the warp's butterfly, images in order). What differs from a GPU is only the device
// compiler's multiply-add contraction and its sqrt, a few ulps (test_grn_emulation.cpp checks the emulation
// against the CPU backend; with a GPU, test_cuda_ops.cpp checks the kernels against the emulation).
#pragma once

#include <type_traits>
#include <vector>

#include "soft_target_emulation.h"
#include "tensor/cuda/grn_threads.h"

namespace cz::testing {

template <class T>
struct GrnEmulation {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  std::vector<A> gx, d;
  std::vector<T> y, dx, dgamma, dbeta;
};

// A in the data's dtype T, rounded as the kernels' cvt (to nearest even through f32).
template <class T, class A>
T emulated_out(A v) {
  if constexpr (std::is_same_v<T, A>)
    return v;
  else
    return T(float(v));
}

// launch::grn_forward, then grn_backward with the output gradient g. x, g: (n, hw, c) row-major.
template <class T>
GrnEmulation<T> emulate_grn(const std::vector<T>& x, const std::vector<T>& g, const std::vector<T>& gamma,
                            const std::vector<T>& beta, int64_t n, int64_t hw, int64_t c, double eps) {
  namespace grn = cuda::grn;
  using A = typename GrnEmulation<T>::A;
  const auto cv = [](T v) { return HostElemCvt::to<A>(v); };
  const auto add = [](A a, A b) { return a + b; };
  const auto at = [](int64_t i) { return static_cast<size_t>(i); };
  GrnEmulation<T> r;
  r.gx.resize(at(n * c));
  r.d.resize(at(n));
  std::vector<A> s(at(n * c)), sg(at(n * c)), lanes(grn::kLanes), lanes_g(grn::kLanes), warp(grn::kWarp);
  // Step 1: per-image sums, forward (gx) and backward (s, sg).
  for (int64_t img = 0; img < n; ++img)
    for (int64_t col = 0; col < c; ++col) {
      const T* xi = x.data() + img * hw * c;
      for (int l = 0; l < grn::kLanes; ++l)
        grn::lane_sums<A, T, HostElemCvt>(xi, static_cast<const T*>(nullptr), hw, c, col, l, lanes[at(l)],
                                          lanes_g[at(l)]);
      r.gx[at(img * c + col)] = grn::sqrt_of(grn::add_lanes(lanes.data(), 1));
      for (int l = 0; l < grn::kLanes; ++l)
        grn::lane_sums<A, T, HostElemCvt>(xi, g.data() + img * hw * c, hw, c, col, l, lanes[at(l)],
                                          lanes_g[at(l)]);
      s[at(img * c + col)] = grn::add_lanes(lanes.data(), 1);
      sg[at(img * c + col)] = grn::add_lanes(lanes_g.data(), 1);
    }
  // Step 2: d per image (forward), k per (image, channel) (backward).
  std::vector<A> k(at(n * c));
  for (int64_t img = 0; img < n; ++img) {
    const A* gi = r.gx.data() + img * c;
    for (int l = 0; l < grn::kWarp; ++l)
      warp[at(l)] = grn::lane_channel_sum<A>(c, l, [&](int64_t i) { return gi[i]; });
    const A dn = r.d[at(img)] = grn::divisor_of(emulate_block_reduce(warp, add), c, A(eps));
    const A* si = s.data() + img * c;
    for (int l = 0; l < grn::kWarp; ++l)
      warp[at(l)] = grn::lane_channel_sum<A>(
          c, l, [&](int64_t i) { return cv(gamma[at(i)]) * si[i] * grn::nx_of(gi[i], dn); });
    const A m = emulate_block_reduce(warp, add) / A(c);
    for (int64_t i = 0; i < c; ++i) k[at(img * c + i)] = grn::k_of(cv(gamma[at(i)]) * si[i], m, dn, gi[i]);
  }
  // Step 3: the parameter gradients.
  for (int64_t col = 0; col < c; ++col) {
    A tg = 0, tb = 0;
    for (int64_t img = 0; img < n; ++img) {
      tg += grn::nx_of(r.gx[at(img * c + col)], r.d[at(img)]) * s[at(img * c + col)];
      tb += sg[at(img * c + col)];
    }
    r.dgamma.push_back(emulated_out<T>(tg));
    r.dbeta.push_back(emulated_out<T>(tb));
  }
  // Step 4: the elementwise passes.
  for (int64_t i = 0; i < n * hw * c; ++i) {
    const int64_t img = i / (hw * c), ch = i % c, nc = img * c + ch;
    const A xv = cv(x[at(i)]), gam = cv(gamma[at(ch)]), nx = grn::nx_of(r.gx[at(nc)], r.d[at(img)]);
    r.y.push_back(emulated_out<T>(grn::out_of(xv, gam, cv(beta[at(ch)]), nx)));
    r.dx.push_back(emulated_out<T>(grn::dx_of(cv(g[at(i)]), xv, gam, nx, k[at(nc)])));
  }
  return r;
}

}  // namespace cz::testing
