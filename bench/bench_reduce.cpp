// Local reduction kernels of the communication layer (dst = a + b, the ring's inner loop) in GB/s of memory
// traffic (two reads and a write per element), next to two peers in the same process: memcpy of the same
// output size (the floor a reduction cannot beat) and a plain scalar loop through Half/BFloat16 conversions.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "dist/comm/reduce_kernels.h"
#include "tensor/half.h"

namespace {

template <class T>
std::vector<T> values(int64_t n, float base) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = T(base + float(i % 97) * 0.01f);
  return v;
}

template <class T, cz::DType D>
void BM_reduce_add(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto a = values<T>(n, 1.f), b = values<T>(n, 2.f), out = values<T>(n, 0.f);
  for (auto _ : state) {
    cz::dist::reduce_add(D, out.data(), a.data(), b.data(), n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * int64_t(sizeof(T)) * 3);
}

template <class T>
void BM_scalar_add(benchmark::State& state) {  // the obvious loop the vectorised kernels replace
  const int64_t n = state.range(0);
  auto a = values<T>(n, 1.f), b = values<T>(n, 2.f), out = values<T>(n, 0.f);
  for (auto _ : state) {
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = T(float(a[size_t(i)]) + float(b[size_t(i)]));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * int64_t(sizeof(T)) * 3);
}

void BM_memcpy(benchmark::State& state) {  // bytes: one read and one write of a 4-byte element
  const int64_t n = state.range(0);
  std::vector<float> a(static_cast<size_t>(n), 1.f), out(static_cast<size_t>(n));
  for (auto _ : state) {
    std::memcpy(out.data(), a.data(), size_t(n) * sizeof(float));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * int64_t(sizeof(float)) * 2);
}

// 64 Ki elements fit in L2, 1 Mi is a ring slice's worth, 8 Mi is out of cache.
#define CZ_SIZES ->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 23)

BENCHMARK_TEMPLATE(BM_reduce_add, float, cz::DType::f32) CZ_SIZES;
BENCHMARK_TEMPLATE(BM_reduce_add, double, cz::DType::f64) CZ_SIZES;
BENCHMARK_TEMPLATE(BM_reduce_add, cz::Half, cz::DType::f16) CZ_SIZES;
BENCHMARK_TEMPLATE(BM_reduce_add, cz::BFloat16, cz::DType::bf16) CZ_SIZES;
BENCHMARK_TEMPLATE(BM_scalar_add, cz::Half) CZ_SIZES;
BENCHMARK_TEMPLATE(BM_scalar_add, cz::BFloat16) CZ_SIZES;
BENCHMARK(BM_memcpy) CZ_SIZES;

}  // namespace

BENCHMARK_MAIN();
