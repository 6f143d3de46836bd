// Softmax cross-entropy with label smoothing and against soft targets (forward and backward), and argmax.
#include <cmath>
#include <limits>
#include <type_traits>

#include "tensor/cpu/kernels.h"
#include "tensor/parallel.h"

namespace cz::cpu {
namespace {

// Calls f(int32_t{}) or f(int64_t{}) for the labels' type.
template <class F>
decltype(auto) visit_label(DType t, F&& f) {
  if (t == DType::i32) return f(int32_t{});
  CZ_CHECK_DTYPE(t == DType::i64, "labels must be i32 or i64, got {}", dtype_name(t));
  return f(int64_t{});
}

// Calls f(z, y, N, K) with the logits (N, K) and the labels (N) as pointers of their types: the logits' float
// type and the labels' integer type.
template <class F>
void with_logits_labels(const Tensor& logits, const Tensor& labels, F&& f) {
  visit_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    visit_label(labels.dtype(), [&](auto ltag) {
      using L = decltype(ltag);
      f(static_cast<const T*>(logits.data<T>()), static_cast<const L*>(labels.data<L>()), logits.size(0),
        logits.size(1));
    });
  });
}

// The largest of a row's K values (K >= 1).
template <class T>
T row_max(const T* z, int64_t K) {
  T m = z[0];
  for (int64_t k = 1; k < K; ++k) m = z[k] > m ? z[k] : m;
  return m;
}

}  // namespace

// Per row, with lse = log sum_k exp(z_k) (computed from the row maximum, so it never overflows):
//   loss_n = -sum_k t_k (z_k - lse) = lse - (1 - s) z_y - (s / K) sum_k z_k,   t = (1 - s) onehot(y) + s / K.
void cross_entropy_forward(const Tensor& logits, const Tensor& labels, double smoothing, Tensor& loss,
                           Tensor& lse) {
  with_logits_labels(logits, labels, [&](const auto* pz, const auto* py, int64_t N, int64_t K) {
    using T = std::decay_t<decltype(*pz)>;
    T* pl = lse.data<T>();
    double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (logits.numel() >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      const T* z = pz + n * K;
      const T m = row_max(z, K);
      double se = 0, sz = 0;
      for (int64_t k = 0; k < K; ++k) {
        se += double(std::exp(z[k] - m));
        sz += double(z[k]);
      }
      const double l = double(m) + std::log(se);
      pl[n] = T(l);
      total += l - (1 - smoothing) * double(z[py[n]]) - smoothing / double(K) * sz;
    }
    loss.data<T>()[0] = T(total / double(N));
  });
}

// dloss/dz_k = g / N * (softmax_k - t_k).
void cross_entropy_backward(const Tensor& gloss, const Tensor& logits, const Tensor& labels,
                            const Tensor& lse, double smoothing, Tensor& dlogits) {
  with_logits_labels(logits, labels, [&](const auto* pz, const auto* py, int64_t N, int64_t K) {
    using T = std::decay_t<decltype(*pz)>;
    const T* pl = lse.data<T>();
    T* pd = dlogits.data<T>();
    const T scale = T(double(gloss.data<T>()[0]) / double(N));
    const T off = T(smoothing / double(K)), hit = T(1 - smoothing);
#pragma omp parallel for schedule(static) if (logits.numel() >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      const T* z = pz + n * K;
      T* d = pd + n * K;
      for (int64_t k = 0; k < K; ++k) d[k] = scale * (std::exp(z[k] - pl[n]) - off);
      d[py[n]] -= scale * hit;
    }
  });
}

// Per row, from the row maximum m and lse = m + log sum_k exp(z_k - m):
//   loss_n = -sum_k t_k (z_k - lse) = S log sum_k exp(z_k - m) - sum_k t_k (z_k - m),   S = sum_k t_k.
// Summing t_k (z_k - m) rather than t_k z_k keeps a large common shift of the logits from cancelling.
void soft_target_cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                                       Tensor& tsum) {
  visit_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = logits.size(0), K = logits.size(1);
    const T* pz = logits.data<T>();
    const T* pt = targets.data<T>();
    T* pl = lse.data<T>();
    T* ps = tsum.data<T>();
    double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (logits.numel() >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      const T* z = pz + n * K;
      const T* t = pt + n * K;
      const T m = row_max(z, K);
      double se = 0, stz = 0, st = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double v = double(z[k] - m);
        se += std::exp(v);
        stz += double(t[k]) * v;
        st += double(t[k]);
      }
      const double log_se = std::log(se);
      pl[n] = T(double(m) + log_se);
      ps[n] = T(st);
      total += st * log_se - stz;
    }
    loss.data<T>()[0] = T(total / double(N));
  });
}

// dloss/dz_k = g / N * (softmax_k S - t_k); dloss/dt_k = g / N * (lse - z_k).
void soft_target_cross_entropy_backward(const Tensor& gloss, const Tensor& logits, const Tensor& targets,
                                        const Tensor& lse, const Tensor& tsum, Tensor& dlogits,
                                        Tensor& dtargets) {
  visit_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = logits.size(0), K = logits.size(1);
    const T* pz = logits.data<T>();
    const T* pt = targets.data<T>();
    const T* pl = lse.data<T>();
    const T* ps = tsum.data<T>();
    T* pdz = dlogits.defined() ? dlogits.data<T>() : nullptr;
    T* pdt = dtargets.defined() ? dtargets.data<T>() : nullptr;
    const T scale = T(double(gloss.data<T>()[0]) / double(N));
#pragma omp parallel for schedule(static) if (logits.numel() >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      const T* z = pz + n * K;
      const T* t = pt + n * K;
      if (pdz)
        for (int64_t k = 0; k < K; ++k) pdz[n * K + k] = scale * (std::exp(z[k] - pl[n]) * ps[n] - t[k]);
      if (pdt)
        for (int64_t k = 0; k < K; ++k) pdt[n * K + k] = scale * (pl[n] - z[k]);
    }
  });
}

void argmax(const Tensor& x, Tensor& out) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t K = x.size(-1), rows = x.numel() / K;
    const T* px = x.data<T>();
    int64_t* po = out.data<int64_t>();
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* z = px + r * K;
      int64_t best = 0;
      for (int64_t k = 1; k < K && !std::isnan(z[best]); ++k)
        if (z[k] > z[best] || std::isnan(z[k])) best = k;
      po[r] = best;
    }
  });
}

}  // namespace cz::cpu
