// GEMM-based kernels: matmul and linear forward/backward, cut as Note [Cutting the rows] says.
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/row_tiles.h"

namespace cz::cpu {

void matmul(const Tensor& a, const Tensor& b, Tensor& out) {
  visit_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
    gemm_rows<T>(false, m, n, k, T(1), a.data<T>(), k, b.data<T>(), n, T(0), out.data<T>(), n);
  });
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  visit_float(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), in = x.size(1), out = w.size(0);
    T* py = y.data<T>();
    T beta = T(0);
    if (bias.defined()) {
      const T* pb = bias.data<T>();
#pragma omp parallel for schedule(static) if (m * out >= kParallelGrain)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < out; ++j) py[r * out + j] = pb[j];
      beta = T(1);
    }
    gemm_rows<T>(true, m, out, in, T(1), x.data<T>(), in, w.data<T>(), in, beta, py, out);
  });
}

void linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db) {
  visit_float(gy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t m = x.size(0), in = x.size(1), out = w.size(0);
    const T* pg = gy.data<T>();
    if (dx.defined()) gemm_rows<T>(false, m, in, out, T(1), pg, out, w.data<T>(), in, T(0), dx.data<T>(), in);
    weight_and_bias_grad<T>(pg, x.data<T>(), m, in, out, dw.defined() ? dw.data<T>() : nullptr,
                            db.defined() ? db.data<T>() : nullptr);
  });
}

}  // namespace cz::cpu
