// Host wrappers of the global average pool kernels (pool.cu): argument checks, device guard, launch status.
#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {
namespace {

struct PoolShape {
  int64_t n, hw, c;
};

// `image` (N, H, W, C) floating and `pooled` (N, C) of its dtype, both on the stream's device.
PoolShape check_pool(const char* op, const char* image_name, const Tensor& image, const char* pooled_name,
                     const Tensor& pooled, Stream stream) {
  detail::check_float(op, image_name, image);
  detail::check_operand(op, image_name, image, image.dtype(), stream);
  CZ_CHECK_SHAPE(image.dim() == 4, "cuda::{}: {} has shape {}", op, image_name, shape_str(image.sizes()));
  const PoolShape s{image.size(0), image.size(1) * image.size(2), image.size(3)};
  detail::check_operand(op, pooled_name, pooled, image.dtype(), stream, s.n * s.c);
  return s;
}

}  // namespace

void global_avg_pool_forward(const Tensor& x, Tensor& y, Stream stream) {
  const PoolShape s = check_pool("global_avg_pool_forward", "x", x, "y", y, stream);
  CZ_CHECK_SHAPE(s.hw > 0 || s.n * s.c == 0, "cuda::global_avg_pool_forward: empty image, x {}",
                 shape_str(x.sizes()));
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::global_avg_pool_forward(detail::config_of(stream), x.dtype(), x.raw_data(),
                                                  y.raw_data(), s.n, s.hw, s.c));
}

void global_avg_pool_backward(const Tensor& gy, Tensor& dx, Stream stream) {
  const PoolShape s = check_pool("global_avg_pool_backward", "dx", dx, "gy", gy, stream);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::global_avg_pool_backward(detail::config_of(stream), dx.dtype(), gy.raw_data(),
                                                   dx.raw_data(), s.n, s.hw, s.c));
}

}  // namespace cz::cuda
