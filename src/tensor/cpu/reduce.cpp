// Full reductions.
#include "tensor/cpu/kernels.h"
#include "tensor/parallel.h"

namespace cz::cpu {

void sum(const Tensor& x, double factor, Tensor& out) {
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    const int64_t n = x.numel();
    double s = 0;
#pragma omp parallel for simd reduction(+ : s) schedule(static) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) s += double(p[i]);
    out.data<T>()[0] = T(s * factor);
  });
}

void broadcast_scalar(const Tensor& scalar, double factor, Tensor& out) {
  visit_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = T(double(scalar.contiguous().data<T>()[0]) * factor);
    T* p = out.data<T>();
    const int64_t n = out.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  });
}

}  // namespace cz::cpu
