// The optimizer's device-scalar kernels (cuda_optim_kernels.cu, Note [The optimizer's device scalars] in
// optim/device_scalars.h) run on the CPU: each kernel's per-thread work through the same host/device
// functions the kernels call, element by element (the updates are elementwise, so the grid's split changes no
// value). Each block of the update kernels makes the per-piece constants from the scalars before its loop;
// every block makes the same ones, so one set stands for all. What differs from a GPU is only the order of
// the squared norm's sum (the f64 reduction kernel, not emulated here: the callers pass a sum).
#pragma once

#include <span>
#include <vector>

#include "optim/adamw.h"
#include "optim/device_scalars.h"
#include "optim/sgd.h"

namespace cz::testing {

namespace os = optim_scalars;

// unscale_kernel with its factor read from scalars[kInvScale]: x *= factor (unless 1), found = 1 on a
// non-finite element.
template <class T>
void emulate_unscale_dev(std::vector<T>& x, const double* scalars, float& found) {
  const T factor = T(scalars[os::kInvScale]);
  for (T& v : x) {
    if (factor != T(1)) v *= factor;
    if (!std::isfinite(v)) found = 1.0f;
  }
}

// clip_scalars_kernel (one thread).
inline void emulate_clip_scalars(double sq, float found, double max_norm, double* scalars) {
  const bool overflow = !os::take_step(found);
  const os::ClipResult r = os::clip_of(sq, overflow, max_norm);
  scalars[os::kNorm] = r.norm;
  scalars[os::kFound] = overflow ? 1.0 : 0.0;
  scalars[os::kClipCoef] = r.coef;
}

// scale_dev_kernel.
template <class T>
void emulate_scale_dev(std::vector<T>& x, const double* scalars, float found) {
  const double coef = scalars[os::kClipCoef];
  if (!os::take_step(found) || coef == 1.0) return;
  const T f = T(coef);
  for (T& v : x) v = v * f;
}

// adamw_dev_kernel over a shard of one range: pieces as shard_pieces gives them.
template <class T>
void emulate_adamw_dev(std::vector<T>& p, const std::vector<T>& g, std::vector<T>& m, std::vector<T>& v,
                       std::span<const ShardPiece> pieces, const AdamWConfig& c, const double* scalars,
                       float found) {
  if (!os::take_step(found)) return;
  const os::AdamWElementConstants<T> ec{T(1.0 - c.beta1), T(c.beta2), T(1.0 - c.beta2),
                                        T(scalars[os::kInvSqrtBc2]), T(c.eps)};
  for (const ShardPiece& piece : pieces) {
    const os::PieceConstants pc =
        os::adamw_piece(scalars[os::kLr], piece.lr_scale, piece.weight_decay, scalars[os::kBc1]);
    for (int64_t i = piece.begin; i < piece.end; ++i) {
      const size_t k = size_t(i);
      os::adamw_element(p[k], g[k], m[k], v[k], T(pc.a), T(pc.b), ec);
    }
  }
}

// sgd_dev_kernel.
template <class T>
void emulate_sgd_dev(std::vector<T>& p, const std::vector<T>& g, std::vector<T>& buf,
                     std::span<const ShardPiece> pieces, const SgdConfig& c, const double* scalars,
                     float found) {
  if (!os::take_step(found)) return;
  const bool use_momentum = c.momentum != 0.0;
  const bool first = scalars[os::kFirstStep] != 0.0;
  for (const ShardPiece& piece : pieces) {
    const os::PieceConstants pc = os::sgd_piece(scalars[os::kLr], piece.lr_scale, piece.weight_decay);
    for (int64_t i = piece.begin; i < piece.end; ++i) {
      const size_t k = size_t(i);
      T b = use_momentum ? buf[k] : T(0);
      os::sgd_element(p[k], g[k], b, T(pc.a), T(pc.b), T(c.momentum), T(1.0 - c.dampening), use_momentum,
                      c.nesterov, first);
      if (use_momentum) buf[k] = b;
    }
  }
}

}  // namespace cz::testing
