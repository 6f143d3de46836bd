// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the fills built on
// it.
#include "tensor/random.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "tensor/autograd/engine.h"

namespace cz {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  std::array<uint32_t, 4> c{uint32_t(counter), uint32_t(counter >> 32), 0u, 0u};
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * c[0];
    const uint64_t p1 = uint64_t(kMul1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k0, uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k1, uint32_t(p0)};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

namespace {

// Two uniforms per Philox block (each from 64 bits), as doubles in [0, 1).
std::vector<double> uniforms(int64_t n, Generator& gen) {
  std::vector<double> u(static_cast<size_t>(n));
  const uint64_t seed = gen.seed();
  const uint64_t first = gen.reserve(uint64_t((n + 1) / 2));
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t b = 0; b < (n + 1) / 2; ++b) {
    const auto r = philox4x32(seed, first + uint64_t(b));
    for (int k = 0; k < 2 && 2 * b + k < n; ++k) {
      const uint64_t bits = (uint64_t(r[size_t(2 * k)]) << 32 | r[size_t(2 * k + 1)]) >> 11;
      u[size_t(2 * b + k)] = double(bits) * 0x1p-53;
    }
  }
  return u;
}

std::vector<double> normals(int64_t n, Generator& gen) {
  std::vector<double> u = uniforms(n + (n & 1), gen);
  std::vector<double> z(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 2) {  // Box-Muller on pairs
    const double r = std::sqrt(-2.0 * std::log1p(-u[size_t(i)]));
    const double theta = 2.0 * std::numbers::pi * u[size_t(i + 1)];
    z[size_t(i)] = r * std::cos(theta);
    if (i + 1 < n) z[size_t(i + 1)] = r * std::sin(theta);
  }
  return z;
}

void assign(Tensor& t, const std::vector<double>& values) {
  CZ_CHECK_DTYPE(is_floating(t.dtype()), "random fill of a {} tensor", dtype_name(t.dtype()));
  Tensor host = from_vector(values, t.sizes());
  NoGradGuard no_grad;
  t.copy_(host);
}

}  // namespace

void uniform_(Tensor& t, double lo, double hi, Generator& gen) {
  std::vector<double> u = uniforms(t.numel(), gen);
  for (double& v : u) v = lo + (hi - lo) * v;
  assign(t, u);
}

void normal_(Tensor& t, double mean, double std, Generator& gen) {
  std::vector<double> z = normals(t.numel(), gen);
  for (double& v : z) v = mean + std * v;
  assign(t, z);
}

void trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator& gen) {
  CZ_CHECK(a < b && std > 0, "trunc_normal_: need a < b and std > 0 (got a={}, b={}, std={})", a, b, std);
  std::vector<double> z = normals(t.numel(), gen);
  for (double& v : z) {
    v = mean + std * v;
    // Resample out-of-range draws from the same stream; the acceptance rate is high for the usual [-2, 2]
    // bounds.
    for (int tries = 0; (v < a || v > b) && tries < 1000; ++tries) v = mean + std * normals(1, gen)[0];
    if (v < a || v > b) v = std::clamp(v, a, b);
  }
  assign(t, z);
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  normal_(t, 0.0, 1.0, gen);
  return t;
}

Tensor randint(int64_t high, const Shape& shape, Generator& gen, DType dtype, Device device) {
  CZ_CHECK(high > 0, "randint: high must be positive, got {}", high);
  std::vector<double> u = uniforms(shape_numel(shape), gen);
  std::vector<int64_t> v(u.size());
  for (size_t i = 0; i < u.size(); ++i) v[i] = std::min<int64_t>(int64_t(u[i] * double(high)), high - 1);
  return from_vector(v, shape).to(dtype).to(device);
}

}  // namespace cz
