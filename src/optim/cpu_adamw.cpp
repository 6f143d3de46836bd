// CPU AdamW and SGD updates: one element-wise update per optimizer, written once over tensor/cpu/simd.h's
// vectors and run as full-width vectors plus bit-identical narrower and scalar tails (Note [Bitwise-identical
// tails]), over OpenMP parts of the shard.
#include <cmath>

#include "optim/cpu_kernels.h"
#include "optim/cpu_pieces.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"

namespace cz::cpu {
namespace {

using simd::load;
using simd::splat;
using simd::store;

// Per-piece AdamW constants, rounded once from f64 to the compute type.
template <class T>
struct AdamWConsts {
  T decay, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2, eps, neg_step_size;
};

template <class T>
AdamWConsts<T> adamw_consts(const ShardPiece& piece, const AdamWStepArgs& a) {
  const double lr = a.lr * piece.lr_scale;
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  return {T(1.0 - lr * piece.weight_decay), T(1.0 - a.beta1), T(a.beta2),    T(1.0 - a.beta2),
          T(1.0 / std::sqrt(bc2)),          T(a.eps),         T(-(lr / bc1))};
}

template <class T>
void adamw_range(T* p, const T* g, T* m, T* v, int64_t n, const AdamWConsts<T>& c) {
  simd::for_blocks<T>(0, n, [&]<class V>(V, int64_t i) {
    const V gi = load<V>(g + i), m0 = load<V>(m + i);
    const V mi = simd::fma(gi - m0, splat<V>(c.one_minus_beta1), m0);
    const V vi = simd::fma(gi * gi, splat<V>(c.one_minus_beta2), load<V>(v + i) * splat<V>(c.beta2));
    const V denom = simd::fma(simd::sqrt(vi), splat<V>(c.inv_sqrt_bc2), splat<V>(c.eps));
    const V pi = load<V>(p + i) * splat<V>(c.decay);
    store(p + i, simd::fma(splat<V>(c.neg_step_size), mi / denom, pi));
    store(m + i, mi);
    store(v + i, vi);
  });
}

template <class T>
struct SgdConsts {
  T weight_decay, momentum, one_minus_dampening, neg_lr;
};

template <class T, bool kMomentum, bool kNesterov, bool kFirst>
void sgd_range(T* p, const T* g, T* buf, int64_t n, const SgdConsts<T>& c) {
  simd::for_blocks<T>(0, n, [&]<class V>(V, int64_t i) {
    const V pi = load<V>(p + i);
    V d = simd::fma(splat<V>(c.weight_decay), pi, load<V>(g + i));
    if constexpr (kMomentum) {
      V b = d;
      if constexpr (!kFirst)
        b = simd::fma(d, splat<V>(c.one_minus_dampening), load<V>(buf + i) * splat<V>(c.momentum));
      store(buf + i, b);
      if constexpr (kNesterov)
        d = simd::fma(splat<V>(c.momentum), b, d);
      else
        d = b;
    }
    store(p + i, simd::fma(splat<V>(c.neg_lr), d, pi));
  });
}

template <class T, bool kMomentum, bool kNesterov, bool kFirst>
void sgd_typed(T* p, const T* g, T* buf, int64_t n, std::span<const ShardPiece> pieces,
               const SgdStepArgs& a) {
  for_each_piece_part(n, pieces, [&](const ShardPiece& piece, int64_t b, int64_t e) {
    const SgdConsts<T> c{T(piece.weight_decay), T(a.momentum), T(1.0 - a.dampening),
                         T(-(a.lr * piece.lr_scale))};
    sgd_range<T, kMomentum, kNesterov, kFirst>(p + b, g + b, kMomentum ? buf + b : nullptr, e - b, c);
  });
}

}  // namespace

void adamw_step(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq,
                std::span<const ShardPiece> pieces, const AdamWStepArgs& args) {
  visit_float(p.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* pp = p.data<T>();
    const T* gp = g.data<T>();
    T* mp = exp_avg.data<T>();
    T* vp = exp_avg_sq.data<T>();
    for_each_piece_part(p.numel(), pieces, [&](const ShardPiece& piece, int64_t b, int64_t e) {
      adamw_range<T>(pp + b, gp + b, mp + b, vp + b, e - b, adamw_consts<T>(piece, args));
    });
  });
}

void sgd_step(Tensor& p, const Tensor& g, Tensor& momentum_buffer, std::span<const ShardPiece> pieces,
              const SgdStepArgs& args) {
  visit_float(p.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* pp = p.data<T>();
    const T* gp = g.data<T>();
    const int64_t n = p.numel();
    if (args.momentum == 0.0) return sgd_typed<T, false, false, false>(pp, gp, nullptr, n, pieces, args);
    T* bp = momentum_buffer.data<T>();
    if (args.first_step)
      return args.nesterov ? sgd_typed<T, true, true, true>(pp, gp, bp, n, pieces, args)
                           : sgd_typed<T, true, false, true>(pp, gp, bp, n, pieces, args);
    return args.nesterov ? sgd_typed<T, true, true, false>(pp, gp, bp, n, pieces, args)
                         : sgd_typed<T, true, false, false>(pp, gp, bp, n, pieces, args);
  });
}

}  // namespace cz::cpu
