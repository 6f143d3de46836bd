// Device-side helpers shared by the .cu kernel files: CUDA element types for our dtypes, conversions with the
// CPU backend's rounding (round-to-nearest-even through f32), 16-byte vectors, strided offsets, grid sizing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tensor/cuda/launch.h"

namespace cz::cuda::detail {

using launch::Config;
using launch::Geometry;

template <class T>
struct Tag {
  using type = T;
};

// The CUDA type of an element type: __half and __nv_bfloat16 for the 16-bit floats.
template <class T>
using cuda_t = std::conditional_t<std::is_same_v<T, Half>, __half,
                                  std::conditional_t<std::is_same_v<T, BFloat16>, __nv_bfloat16, T>>;

// Calls f(Tag<T>{}) with the CUDA type of any dtype.
template <class F>
cudaError_t visit_any(DType t, F&& f) {
  return visit_dtype(t, [&](auto v) -> cudaError_t { return f(Tag<cuda_t<decltype(v)>>{}); });
}

// visit_any for the dtypes whose CUDA type Keep admits; cudaErrorInvalidValue for the others (the host
// wrappers have refused them already), whose kernels are never instantiated.
template <template <class> class Keep, class F>
cudaError_t visit_if(DType t, F&& f) {
  return visit_any(t, [&](auto tag) -> cudaError_t {
    if constexpr (Keep<typename decltype(tag)::type>::value)
      return f(tag);
    else
      return cudaErrorInvalidValue;
  });
}

template <class T>
struct IsFloat : std::bool_constant<std::is_floating_point_v<T> || std::is_same_v<T, __half> ||
                                    std::is_same_v<T, __nv_bfloat16>> {};

// Calls f(Tag<T>{}) with the CUDA type of a floating dtype.
template <class F>
cudaError_t visit_float(DType t, F&& f) {
  return visit_if<IsFloat>(t, std::forward<F>(f));
}

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// D(s) with the CPU backend's semantics (cpu/basic.cpp): 16-bit floats go through f32 with round-to-nearest-
// even, bool is `s != 0`, everything else a static_cast.
template <class D, class S>
__device__ __forceinline__ D cvt(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<S, __half>) {
    return cvt<D>(__half2float(s));
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return cvt<D>(__bfloat162float(s));
  } else if constexpr (std::is_same_v<D, __half>) {
    return __float2half_rn(static_cast<float>(s));
  } else if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(s));
  } else if constexpr (std::is_same_v<D, bool>) {
    return s != S(0);
  } else {
    return static_cast<D>(s);
  }
}

template <class T>
__device__ __forceinline__ acc_t<T> to_acc(T v) {
  return cvt<acc_t<T>>(v);
}

// N elements moved as one 16-byte (or smaller) load/store.
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <class T>
inline constexpr int kVec16 = int(16 / sizeof(T));

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `items` work items: enough to fill every SM twice over at full
// occupancy, never more than there is work for.
inline int grid_for(int64_t items, int sm_count, int threads = kThreads) {
  const int64_t max_blocks = int64_t(std::max(sm_count, 1)) * (2048 / threads) * 2;
  const int64_t want = (items + threads - 1) / threads;
  return int(std::clamp<int64_t>(want, 1, max_blocks));
}

__device__ __forceinline__ int64_t global_thread() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() {
  return int64_t(gridDim.x) * blockDim.x;
}

// Element offsets of linear index i (row-major over g.sizes) for every operand. The innermost dimension needs
// no division, so one-dimensional geometry (flat or evenly strided) costs one multiply per operand.
template <int kOps>
__device__ __forceinline__ void offsets_of(const Geometry<kOps>& g, int64_t i, int64_t (&off)[kOps]) {
#pragma unroll
  for (int k = 0; k < kOps; ++k) off[k] = 0;
  for (int d = g.ndim - 1; d > 0; --d) {
    const int64_t q = i / g.sizes[d];
    const int64_t r = i - q * g.sizes[d];
#pragma unroll
    for (int k = 0; k < kOps; ++k) off[k] += r * g.strides[k][d];
    i = q;
  }
#pragma unroll
  for (int k = 0; k < kOps; ++k) off[k] += i * g.strides[k][0];
}

// Deterministic column reductions (column sums, LayerNorm's parameter gradients): blocks of kColTile columns
// x kRowLanes row lanes each walk a chunk of rows; per-chunk partials are then added up in chunk order. About
// 8 blocks per SM, at least 64 rows per chunk, at most 1024 chunks.
constexpr int kColTile = 32, kRowLanes = 8;

struct ColumnPlan {
  int64_t col_tiles, chunks, rows_per_chunk;
};

inline ColumnPlan column_plan(int64_t rows, int64_t cols, int sm_count) {
  ColumnPlan p;
  p.col_tiles = (cols + kColTile - 1) / kColTile;
  const int64_t want = (int64_t(std::max(sm_count, 1)) * 8 + p.col_tiles - 1) / p.col_tiles;
  const int64_t max_chunks = std::max<int64_t>((rows + 63) / 64, 1);
  p.chunks = std::clamp<int64_t>(want, 1, std::min<int64_t>(max_chunks, 1024));
  p.rows_per_chunk = std::max<int64_t>((rows + p.chunks - 1) / p.chunks, 1);
  p.chunks = std::max<int64_t>((rows + p.rows_per_chunk - 1) / p.rows_per_chunk, 1);
  return p;
}

}  // namespace cz::cuda::detail
