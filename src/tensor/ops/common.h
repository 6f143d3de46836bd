// Validation helpers shared by op definitions. Every message names the op and what it found.
#pragma once

#include "tensor/autograd/engine.h"
#include "tensor/autograd/node.h"
#include "tensor/profiler.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace cz::ops {

inline void check_defined(const char* op, const char* what, const Tensor& t) {
  CZ_CHECK(t.defined(), "{}: {} is an undefined tensor", op, what);
}

inline void check_floating(const char* op, const char* what, const Tensor& t) {
  check_defined(op, what, t);
  CZ_CHECK_DTYPE(is_floating(t.dtype()), "{}: {} must be a floating-point tensor, got {}", op, what,
                 dtype_name(t.dtype()));
}

// Same dtype and device as `ref` (the op's main input).
inline void check_like(const char* op, const char* what, const Tensor& t, const char* ref_what,
                       const Tensor& ref) {
  check_defined(op, what, t);
  CZ_CHECK_DTYPE(t.dtype() == ref.dtype(), "{}: {} is {} but {} is {}", op, what, dtype_name(t.dtype()),
                 ref_what, dtype_name(ref.dtype()));
  CZ_CHECK_DEVICE(t.device() == ref.device(), "{}: {} is on {} but {} is on {}", op, what, t.device().str(),
                  ref_what, ref.device().str());
}

inline void check_same_shape(const char* op, const char* a_what, const Tensor& a, const char* b_what,
                             const Tensor& b) {
  check_like(op, b_what, b, a_what, a);
  CZ_CHECK_SHAPE(a.sizes() == b.sizes(), "{}: {} has shape {} but {} has shape {}", op, a_what,
                 shape_str(a.sizes()), b_what, shape_str(b.sizes()));
}

inline void check_dim(const char* op, const char* what, const Tensor& t, int64_t ndim, const char* layout) {
  CZ_CHECK_SHAPE(t.dim() == ndim, "{}: {} must be {}-d {}, got shape {}", op, what, ndim, layout,
                 shape_str(t.sizes()));
}

// CPU kernels compute in f32 or f64; f16/bf16 compute needs the CUDA backend.
inline void check_cpu_compute_dtype(const char* op, const Tensor& t) {
  CZ_CHECK_DTYPE(!t.is_cpu() || t.dtype() == DType::f32 || t.dtype() == DType::f64,
                 "{}: the CPU backend computes in f32 or f64, got {} (f16/bf16 compute runs on CUDA)", op,
                 dtype_name(t.dtype()));
}

inline Stream stream_of(const Tensor& t) {
  return current_stream(t.device());
}

}  // namespace cz::ops
