// Host wrappers of the global average pool kernels (pool.cu): argument checks, device guard, launch status.
#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {

using detail::check_float;
using detail::check_numel;
using detail::check_operand;

void global_avg_pool_forward(const Tensor& x, Tensor& y, Stream stream) {
  check_float("global_avg_pool_forward", "x", x);
  check_operand("global_avg_pool_forward", "x", x, x.dtype(), stream);
  check_operand("global_avg_pool_forward", "y", y, x.dtype(), stream);
  CZ_CHECK_SHAPE(x.dim() == 4, "cuda::global_avg_pool_forward: x has shape {}", shape_str(x.sizes()));
  const int64_t n = x.size(0), hw = x.size(1) * x.size(2), c = x.size(3);
  check_numel("global_avg_pool_forward", "y", y, n * c);
  CZ_CHECK_SHAPE(hw > 0 || n * c == 0, "cuda::global_avg_pool_forward: empty image, x {}",
                 shape_str(x.sizes()));
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::global_avg_pool_forward(detail::config_of(stream), x.dtype(), x.raw_data(),
                                                  y.raw_data(), n, hw, c));
}

void global_avg_pool_backward(const Tensor& gy, Tensor& dx, Stream stream) {
  check_float("global_avg_pool_backward", "dx", dx);
  check_operand("global_avg_pool_backward", "dx", dx, dx.dtype(), stream);
  check_operand("global_avg_pool_backward", "gy", gy, dx.dtype(), stream);
  CZ_CHECK_SHAPE(dx.dim() == 4, "cuda::global_avg_pool_backward: dx has shape {}", shape_str(dx.sizes()));
  const int64_t n = dx.size(0), hw = dx.size(1) * dx.size(2), c = dx.size(3);
  check_numel("global_avg_pool_backward", "gy", gy, n * c);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::global_avg_pool_backward(detail::config_of(stream), dx.dtype(), gy.raw_data(),
                                                   dx.raw_data(), n, hw, c));
}

}  // namespace cz::cuda
