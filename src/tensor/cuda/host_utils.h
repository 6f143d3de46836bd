// Host-side helpers for the CUDA kernel wrappers: argument checks, launch configuration, strided geometry,
// and stream-ordered temporaries.
#pragma once

#include <array>
#include <memory>

#include "tensor/cuda/allocator.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/launch.h"
#include "tensor/cuda/status.h"
#include "tensor/tensor.h"

namespace cz::cuda::detail {

// `t` lives on the stream's GPU. Kernels are only reached through validated ops, but a wrong device here
// would be a silent memory error, so it is checked anyway.
inline void check_on(const char* op, const char* what, const Tensor& t, Stream stream) {
  CZ_CHECK(t.defined(), "cuda::{}: {} is undefined", op, what);
  CZ_CHECK_DEVICE(t.is_cuda() && t.device() == stream.device, "cuda::{}: {} is on {} but the stream on {}",
                  op, what, t.device().str(), stream.device.str());
}

inline void check_float(const char* op, const char* what, const Tensor& t) {
  CZ_CHECK_DTYPE(is_floating(t.dtype()), "cuda::{}: {} must be f32, f64, f16 or bf16, got {}", op, what,
                 dtype_name(t.dtype()));
}

// Same device, dtype, and contiguous (the layout contract of the non-strided kernels).
inline void check_operand(const char* op, const char* what, const Tensor& t, DType dtype, Stream stream) {
  check_on(op, what, t, stream);
  CZ_CHECK_DTYPE(t.dtype() == dtype, "cuda::{}: {} is {}, expected {}", op, what, dtype_name(t.dtype()),
                 dtype_name(dtype));
  CZ_CHECK_SHAPE(t.is_contiguous(), "cuda::{}: {} must be contiguous", op, what);
}

// check_operand, and `t` holds `numel` elements.
inline void check_operand(const char* op, const char* what, const Tensor& t, DType dtype, Stream stream,
                          int64_t numel) {
  check_operand(op, what, t, dtype, stream);
  CZ_CHECK_SHAPE(t.numel() == numel, "cuda::{}: {} has shape {} ({} elements), expected {} elements", op,
                 what, shape_str(t.sizes()), t.numel(), numel);
}

inline launch::Config config_of(Stream stream) {
  return {native(stream), context(stream.device.index).sm_count()};
}

template <int kOps>
launch::Geometry<kOps> geometry(const char* op, const Shape& sizes,
                                const std::array<const Shape*, kOps>& strides) {
  launch::Geometry<kOps> g;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    bool merge = g.ndim > 0;
    for (int k = 0; merge && k < kOps; ++k) merge = g.strides[k][g.ndim - 1] == (*strides[k])[d] * sizes[d];
    if (merge) {
      g.sizes[g.ndim - 1] *= sizes[d];
      for (int k = 0; k < kOps; ++k) g.strides[k][g.ndim - 1] = (*strides[k])[d];
      continue;
    }
    CZ_CHECK_SHAPE(g.ndim < launch::kMaxDims,
                   "cuda::{}: shape {} has more than {} dimensions that cannot be merged", op,
                   shape_str(sizes), launch::kMaxDims);
    g.sizes[g.ndim] = sizes[d];
    for (int k = 0; k < kOps; ++k) g.strides[k][g.ndim] = (*strides[k])[d];
    ++g.ndim;
  }
  if (g.ndim == 0) {  // a single element
    g.ndim = 1;
    g.sizes[0] = 1;
    for (int k = 0; k < kOps; ++k) g.strides[k][0] = 1;
  }
  return g;
}

// A contiguous tensor whose block belongs to `stream` (Note [Cross-stream frees]): for temporaries of a
// launcher, which may be dropped as soon as the work using them is queued.
inline Tensor empty_on(const Shape& shape, DType dtype, Stream stream) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(allocate(size_t(shape_numel(shape)) * dtype_size(dtype), stream),
                                            stream.device);
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace cz::cuda::detail
