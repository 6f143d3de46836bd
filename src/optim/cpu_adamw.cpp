// CPU AdamW and SGD updates: one element-wise update per optimizer, written once over simd.h's Ops and run as
// AVX-512 / AVX2 vectors plus a bit-identical scalar tail, over OpenMP parts of the shard.
#include <cmath>

#include "optim/cpu_kernels.h"
#include "optim/cpu_pieces.h"
#include "optim/simd.h"
#include "tensor/cpu/kernels.h"

namespace cz::cpu {
namespace {

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
  simd::vector_loop<T>(n, [&]<class O>(int64_t i) {
    using V = typename O::V;
    const V gi = O::load(g + i);
    const V mi = O::fma(O::sub(gi, O::load(m + i)), O::set1(c.one_minus_beta1), O::load(m + i));
    const V vi = O::fma(O::mul(gi, gi), O::set1(c.one_minus_beta2), O::mul(O::load(v + i), O::set1(c.beta2)));
    const V denom = O::fma(O::sqrt(vi), O::set1(c.inv_sqrt_bc2), O::set1(c.eps));
    const V pi = O::mul(O::load(p + i), O::set1(c.decay));
    O::store(p + i, O::fma(O::set1(c.neg_step_size), O::div(mi, denom), pi));
    O::store(m + i, mi);
    O::store(v + i, vi);
  });
}

template <class T>
struct SgdConsts {
  T weight_decay, momentum, one_minus_dampening, neg_lr;
};

template <class T, bool kMomentum, bool kNesterov, bool kFirst>
void sgd_range(T* p, const T* g, T* buf, int64_t n, const SgdConsts<T>& c) {
  simd::vector_loop<T>(n, [&]<class O>(int64_t i) {
    using V = typename O::V;
    const V pi = O::load(p + i);
    V d = O::fma(O::set1(c.weight_decay), pi, O::load(g + i));
    if constexpr (kMomentum) {
      V b;
      if constexpr (kFirst) {
        b = d;
      } else {
        b = O::fma(d, O::set1(c.one_minus_dampening), O::mul(O::load(buf + i), O::set1(c.momentum)));
      }
      O::store(buf + i, b);
      d = kNesterov ? O::fma(O::set1(c.momentum), b, d) : b;
    }
    O::store(p + i, O::fma(O::set1(c.neg_lr), d, pi));
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
