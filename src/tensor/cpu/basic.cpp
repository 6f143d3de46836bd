// Fill, strided copy with dtype conversion, axpy and scale: the memory ops every other piece stands on.
#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "tensor/cpu/kernels.h"
#include "tensor/parallel.h"

namespace cz::cpu {
namespace {

template <class D, class S>
inline D convert(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
    return convert<D>(float(s));
  } else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) {
    return D(float(s));
  } else if constexpr (std::is_same_v<D, bool>) {
    return s != S(0);
  } else {
    return static_cast<D>(s);
  }
}

// Geometry with adjacent dims merged where both operands allow it, so most copies become one flat loop.
struct Strided {
  Shape sizes;
  std::vector<Shape> strides;  // one per operand
};

Strided coalesce(const Shape& sizes, std::vector<Shape> strides) {
  Strided out;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    bool merge = !out.sizes.empty();
    for (size_t k = 0; merge && k < strides.size(); ++k)
      merge = out.strides[k].back() == strides[k][d] * sizes[d];
    if (merge) {
      out.sizes.back() *= sizes[d];
      for (size_t k = 0; k < strides.size(); ++k) out.strides[k].back() = strides[k][d];
    } else {
      out.sizes.push_back(sizes[d]);
      if (out.strides.empty()) out.strides.resize(strides.size());
      for (size_t k = 0; k < strides.size(); ++k) out.strides[k].push_back(strides[k][d]);
    }
  }
  if (out.sizes.empty()) {
    out.sizes = {1};
    out.strides.assign(strides.size(), Shape{1});
  }
  return out;
}

// Calls f(offsets, n, inner strides) for runs of the last dim, in parallel. A contiguous tensor coalesces to
// one long row, so rows alone would leave it on one thread (the gradient buffer's fill and every parameter's
// AccumulateGrad ran serially, 6% of ConvNeXt-atto's CPU step, with the other thread waiting): rows are cut
// into pieces of at least kParallelGrain elements, up to one per thread for each row.
template <size_t N, class F>
void for_each_row(const Strided& g, F&& f) {
  const int64_t ndim = int64_t(g.sizes.size());
  const int64_t inner = g.sizes.back();
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < ndim; ++d) rows *= g.sizes[size_t(d)];
  const bool parallel = rows * inner >= kParallelGrain && cpu_threads() > 1;
  const int64_t pieces =
      parallel && rows < cpu_threads() ? std::clamp<int64_t>(inner / kParallelGrain, 1, cpu_threads()) : 1;
  const int64_t piece = (inner + pieces - 1) / pieces;
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = g.strides[k].back();
#pragma omp parallel for schedule(static) if (parallel && rows * pieces > 1)
  for (int64_t item = 0; item < rows * pieces; ++item) {
    const int64_t r = item / pieces;
    const int64_t begin = (item % pieces) * piece;
    const int64_t n = std::min(inner, begin + piece) - begin;
    std::array<int64_t, N> off{};
    int64_t rem = r;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      const int64_t i = rem % g.sizes[size_t(d)];
      rem /= g.sizes[size_t(d)];
      for (size_t k = 0; k < N; ++k) off[k] += i * g.strides[k][size_t(d)];
    }
    for (size_t k = 0; k < N; ++k) off[k] += begin * inner_stride[k];
    if (n > 0) f(off, n, inner_stride);
  }
}

}  // namespace

void fill(Tensor& dst, double value) {
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = convert<T>(value);
    T* p = static_cast<T*>(dst.raw_data());
    Strided g = coalesce(dst.sizes(), {dst.strides()});
    for_each_row<1>(g, [&](auto off, int64_t n, auto st) {
      T* row = p + off[0];
      for (int64_t i = 0; i < n; ++i) row[i * st[0]] = v;
    });
  });
}

void copy(const Tensor& src, Tensor& dst) {
  visit_dtype(src.dtype(), [&](auto stag) {
    visit_dtype(dst.dtype(), [&](auto dtag) {
      using S = decltype(stag);
      using D = decltype(dtag);
      const S* s = static_cast<const S*>(src.raw_data());
      D* d = static_cast<D*>(dst.raw_data());
      Strided g = coalesce(dst.sizes(), {dst.strides(), src.strides()});
      for_each_row<2>(g, [&](auto off, int64_t n, auto st) {
        D* drow = d + off[0];
        const S* srow = s + off[1];
        if (st[0] == 1 && st[1] == 1) {
          for (int64_t i = 0; i < n; ++i) drow[i] = convert<D>(srow[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) drow[i * st[0]] = convert<D>(srow[i * st[1]]);
        }
      });
    });
  });
}

// Note [Streaming gradient copies]: a store to a line not in the cache first reads the line (write-allocate),
// so copying a gradient over the previous step's in the flat buffer (Note [Deferred gradient zero]) moved as
// many bytes as adding into it: ConvNeXt-atto's CPU step (one thread) took 3.6 ms in AccumulateGrad's copies
// against 3.2 ms in its adds. Non-temporal stores write whole lines without reading them: 2.2-2.6 ms with
// AVX-512's (bench_train_step --profile 10; SSE2's 16-byte ones took 2.8-3.1 ms). The buffer is read next by
// the reduction or the optimizer, after the rest of backward has passed through the caches. Small copies
// (under 64 KiB) stay cached ones.
void copy_streaming(const Tensor& src, Tensor& dst) {
  constexpr int64_t kLine = 64;
  const int64_t bytes = int64_t(dst.nbytes());
#if defined(__SSE2__)
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous() &&
      bytes >= kStreamingCopyBytes) {
    char* d = static_cast<char*>(dst.raw_data());
    const char* s = static_cast<const char*>(src.raw_data());
    // Up to the destination's first line boundary and from its last one: ordinary copies.
    const int64_t head = (kLine - int64_t(reinterpret_cast<uintptr_t>(d) % kLine)) % kLine;
    const int64_t lines = (bytes - head) / kLine;
    std::memcpy(d, s, size_t(head));
    const int64_t tail = head + lines * kLine;
    std::memcpy(d + tail, s + tail, size_t(bytes - tail));
    const bool parallel = cpu_threads() > 1;  // at least 64 KiB, as axpy splits from kParallelGrain floats
#pragma omp parallel if (parallel)
    {
#pragma omp for schedule(static) nowait
      for (int64_t l = 0; l < lines; ++l) {
        char* out = d + head + l * kLine;  // 64-byte aligned
        const char* in = s + head + l * kLine;
#if defined(__AVX512F__)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(out), _mm512_loadu_si512(in));
#else
        for (int k = 0; k < kLine; k += 16)
          _mm_stream_si128(reinterpret_cast<__m128i*>(out + k),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + k)));
#endif
      }
      // Each thread's streaming stores (weakly ordered) drained before the region's closing barrier, so
      // whatever reads the buffer next, on any thread, sees them.
      _mm_sfence();
    }
    return;
  }
#endif
  copy(src, dst);
}

void axpy(const Tensor& x, double alpha, Tensor& y) {
  CZ_CHECK_DTYPE(is_floating(y.dtype()) && x.dtype() == y.dtype(), "axpy: dtypes {} and {}",
                 dtype_name(x.dtype()), dtype_name(y.dtype()));
  visit_dtype(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const Acc a = Acc(alpha);
      const T* xp = static_cast<const T*>(x.raw_data());
      T* yp = static_cast<T*>(y.raw_data());
      Strided g = coalesce(y.sizes(), {y.strides(), x.strides()});
      for_each_row<2>(g, [&](auto off, int64_t n, auto st) {
        T* yr = yp + off[0];
        const T* xr = xp + off[1];
        if (st[0] == 1 && st[1] == 1) {
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) yr[i] = T(Acc(yr[i]) + a * Acc(xr[i]));
        } else {
          for (int64_t i = 0; i < n; ++i) yr[i * st[0]] = T(Acc(yr[i * st[0]]) + a * Acc(xr[i * st[1]]));
        }
      });
    }
  });
}

void scale(Tensor& x, double factor) {
  CZ_CHECK_DTYPE(is_floating(x.dtype()), "scale: {} tensor", dtype_name(x.dtype()));
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const Acc f = Acc(factor);
      T* p = static_cast<T*>(x.raw_data());
      Strided g = coalesce(x.sizes(), {x.strides()});
      for_each_row<1>(g, [&](auto off, int64_t n, auto st) {
        T* r = p + off[0];
        for (int64_t i = 0; i < n; ++i) r[i * st[0]] = T(Acc(r[i * st[0]]) * f);
      });
    }
  });
}

}  // namespace cz::cpu
