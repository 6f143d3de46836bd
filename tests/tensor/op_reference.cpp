// Naive f64 references for the ConvNeXt ops (see op_reference.h).
#include "op_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/random.h"

namespace cz::testing {
namespace {

std::vector<double> host(const Tensor& t) {
  return t.to_vector<double>();
}
Tensor make(const std::vector<double>& v, const Shape& shape) {
  return from_vector(v, shape);
}
size_t at(int64_t i) {
  return static_cast<size_t>(i);
}
// log(sum_k exp(z[k])) over K logits, shifted by their maximum.
double log_sum_exp(const double* z, int64_t K) {
  double m = -INFINITY;
  for (int64_t k = 0; k < K; ++k) m = std::max(m, z[k]);
  double s = 0;
  for (int64_t k = 0; k < K; ++k) s += std::exp(z[k] - m);
  return m + std::log(s);
}

}  // namespace

Tensor ref_linear(const Tensor& x, const Tensor& weight, const Tensor* bias) {
  const int64_t in = weight.size(1), out = weight.size(0), rows = x.numel() / in;
  const auto xv = host(x), wv = host(weight);
  const std::vector<double> bv = bias ? host(*bias) : std::vector<double>(at(out), 0.0);
  std::vector<double> y(at(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = bv[at(o)];
      for (int64_t i = 0; i < in; ++i) acc += xv[at(r * in + i)] * wv[at(o * in + i)];
      y[at(r * out + o)] = acc;
    }
  Shape shape = x.sizes();
  shape.back() = out;
  return make(y, shape);
}

Tensor ref_gelu(const Tensor& x) {
  auto v = host(x);
  for (double& a : v) a = 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0)));
  return make(v, x.sizes());
}

Tensor ref_layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, double eps) {
  auto v = host(x);
  const int64_t C = x.size(-1), rows = x.numel() / C;
  const std::vector<double> w = weight ? host(*weight) : std::vector<double>(at(C), 1.0);
  const std::vector<double> b = bias ? host(*bias) : std::vector<double>(at(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += v[at(r * C + c)];
    mean /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (v[at(r * C + c)] - mean) * (v[at(r * C + c)] - mean);
    var /= double(C);
    for (int64_t c = 0; c < C; ++c) {
      double& e = v[at(r * C + c)];
      e = (e - mean) / std::sqrt(var + eps) * w[at(c)] + b[at(c)];
    }
  }
  return make(v, x.sizes());
}

Tensor ref_depthwise_conv2d(const Tensor& x, const Tensor& weight, const Tensor* bias) {
  const auto xv = host(x), wv = host(weight);
  const int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3), k = weight.size(2), p = k / 2;
  const std::vector<double> b = bias ? host(*bias) : std::vector<double>(at(C), 0.0);
  std::vector<double> y(xv.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w)
        for (int64_t c = 0; c < C; ++c) {
          double acc = b[at(c)];
          for (int64_t i = 0; i < k; ++i)
            for (int64_t j = 0; j < k; ++j) {
              const int64_t hi = h + i - p, wj = w + j - p;
              if (hi < 0 || hi >= H || wj < 0 || wj >= W) continue;
              acc += xv[at(((n * H + hi) * W + wj) * C + c)] * wv[at((c * k + i) * k + j)];
            }
          y[at(((n * H + h) * W + w) * C + c)] = acc;
        }
  return make(y, x.sizes());
}

Tensor ref_patchify_conv2d(const Tensor& x, const Tensor& weight, const Tensor* bias) {
  const auto xv = host(x), wv = host(weight);
  const int64_t N = x.size(0), H = x.size(1), W = x.size(2), Cin = x.size(3);
  const int64_t Cout = weight.size(0), k = weight.size(2), Ho = H / k, Wo = W / k;
  const std::vector<double> b = bias ? host(*bias) : std::vector<double>(at(Cout), 0.0);
  std::vector<double> y(at(N * Ho * Wo * Cout));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ho = 0; ho < Ho; ++ho)
      for (int64_t wo = 0; wo < Wo; ++wo)
        for (int64_t o = 0; o < Cout; ++o) {
          double acc = b[at(o)];
          for (int64_t ci = 0; ci < Cin; ++ci)
            for (int64_t i = 0; i < k; ++i)
              for (int64_t j = 0; j < k; ++j)
                acc += xv[at(((n * H + ho * k + i) * W + wo * k + j) * Cin + ci)] *
                       wv[at(((o * Cin + ci) * k + i) * k + j)];
          y[at(((n * Ho + ho) * Wo + wo) * Cout + o)] = acc;
        }
  return make(y, {N, Ho, Wo, Cout});
}

Tensor ref_global_avg_pool(const Tensor& x) {
  const auto xv = host(x);
  const int64_t N = x.size(0), HW = x.size(1) * x.size(2), C = x.size(3);
  std::vector<double> y(at(N * C), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t q = 0; q < HW; ++q)
      for (int64_t c = 0; c < C; ++c) y[at(n * C + c)] += xv[at((n * HW + q) * C + c)] / double(HW);
  return make(y, {N, C});
}

Tensor ref_grn(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  auto v = host(x);
  const auto gv = host(gamma), bv = host(beta);
  const int64_t N = x.size(0), HW = x.size(1) * x.size(2), C = x.size(3);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> norm(at(C), 0.0);
    for (int64_t q = 0; q < HW; ++q)
      for (int64_t c = 0; c < C; ++c)
        norm[at(c)] += v[at((n * HW + q) * C + c)] * v[at((n * HW + q) * C + c)];
    double mean = 0;
    for (double& g : norm) {
      g = std::sqrt(g);
      mean += g / double(C);
    }
    for (int64_t q = 0; q < HW; ++q)
      for (int64_t c = 0; c < C; ++c) {
        double& e = v[at((n * HW + q) * C + c)];
        e = e + bv[at(c)] + gv[at(c)] * e * norm[at(c)] / (mean + eps);
      }
  }
  return make(v, x.sizes());
}

Tensor ref_cross_entropy(const Tensor& logits, const Tensor& labels, double smoothing) {
  const auto z = host(logits);
  const auto y = labels.to_vector<int64_t>();
  const int64_t N = logits.size(0), K = logits.size(1);
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double lse = log_sum_exp(&z[at(n * K)], K);
    // PyTorch: (1 - eps) * nll + eps * mean_k(-log p_k).
    double smooth = 0;
    for (int64_t k = 0; k < K; ++k) smooth += lse - z[at(n * K + k)];
    total += (1 - smoothing) * (lse - z[at(n * K + y[at(n)])]) + smoothing * smooth / double(K);
  }
  return make({total / double(N)}, {});
}

Tensor ref_soft_target_cross_entropy(const Tensor& logits, const Tensor& targets) {
  const auto z = host(logits), t = host(targets);
  const int64_t N = logits.size(0), K = logits.size(1);
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double lse = log_sum_exp(&z[at(n * K)], K);
    for (int64_t k = 0; k < K; ++k) total -= t[at(n * K + k)] * (z[at(n * K + k)] - lse);
  }
  return make({total / double(N)}, {});
}

Tensor ref_drop_path(const Tensor& x, double p, uint64_t seed) {
  auto v = host(x);
  // Sample n's uniform comes from Philox block n of a fresh generator: 53 bits of its first two words.
  std::vector<double> u(static_cast<size_t>(x.size(0)));
  for (size_t n = 0; n < u.size(); ++n) {
    const auto r = philox4x32(seed, n);
    u[n] = double((uint64_t(r[0]) << 21) ^ uint64_t(r[1])) * 0x1p-53;
  }
  const int64_t inner = x.numel() / x.size(0);
  for (int64_t i = 0; i < x.numel(); ++i) v[at(i)] *= u[at(i / inner)] >= p ? 1.0 / (1.0 - p) : 0.0;
  return make(v, x.sizes());
}

}  // namespace cz::testing
