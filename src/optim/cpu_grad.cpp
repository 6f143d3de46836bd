// CPU kernels over gradient and weight buffers: the f64 sum of squares behind global-norm clipping, the
// non-finite check fused with loss unscaling, and the EMA update.
#include <bit>
#include <cstdint>
#include <vector>

#include "optim/cpu_kernels.h"
#include "optim/cpu_pieces.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"

namespace cz::cpu {
namespace {

// Block size of the sum of squares: each block is summed by one thread in a fixed order, then the blocks are
// added in index order, so the result is the same for any thread count.
constexpr int64_t kNormBlock = 1 << 14;

template <class T>
double sq_norm_typed(const T* x, int64_t n) {
  const int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const T* xb = x + b * kNormBlock;
    const int64_t len = std::min(kNormBlock, n - b * kNormBlock);
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < len; ++i) {
      const double v = double(xb[i]);
      acc += v * v;
    }
    partial[size_t(b)] = acc;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

// The exponent field all ones: Inf or NaN. Integer test, so it survives -ffast-math and vectorizes.
template <class T>
struct Bits;
template <>
struct Bits<float> {
  using U = uint32_t;
  static constexpr U kExp = 0x7f800000u;
};
template <>
struct Bits<double> {
  using U = uint64_t;
  static constexpr U kExp = 0x7ff0000000000000ull;
};

template <class T>
bool unscale_typed(T* x, int64_t n, T factor) {
  using U = typename Bits<T>::U;
  constexpr U kExp = Bits<T>::kExp;
  int bad = 0;
  if (factor == T(1)) {
#pragma omp parallel for simd schedule(static) reduction(| : bad) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) bad |= (std::bit_cast<U>(x[i]) & kExp) == kExp;
  } else {
#pragma omp parallel for simd schedule(static) reduction(| : bad) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      x[i] *= factor;
      bad |= (std::bit_cast<U>(x[i]) & kExp) == kExp;
    }
  }
  return bad != 0;
}

}  // namespace

void sq_norm(const Tensor& x, Tensor& out) {
  const double s = visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return sq_norm_typed<T>(x.data<T>(), x.numel());
  });
  *out.data<double>() = s;
}

void unscale_and_check(Tensor& x, double factor, Tensor& found) {
  const bool bad = visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return unscale_typed<T>(x.data<T>(), x.numel(), T(factor));
  });
  if (bad) *found.data<float>() = 1.0f;
}

void ema_update(Tensor& ema, const Tensor& p, double decay) {
  visit_float(ema.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* e = ema.data<T>();
    const T* q = p.data<T>();
    const T d = T(decay), one_minus_d = T(1.0 - decay);
    for_each_part(ema.numel(), [&](int64_t lo, int64_t hi) {
      simd::for_blocks<T>(lo, hi, [&]<class V>(V, int64_t k) {
        using simd::load, simd::splat;
        simd::store(e + k, simd::fma(splat<V>(d), load<V>(e + k), splat<V>(one_minus_d) * load<V>(q + k)));
      });
    });
  });
}

}  // namespace cz::cpu
