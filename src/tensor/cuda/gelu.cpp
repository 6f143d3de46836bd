// Host wrappers of the exact (erf) GELU kernels (gelu.cu): argument checks, device guard, launch status.
#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {

using detail::check_float;
using detail::check_operand;

void gelu_forward(const Tensor& x, Tensor& y, Stream stream) {
  check_float("gelu_forward", "x", x);
  check_operand("gelu_forward", "x", x, x.dtype(), stream);
  check_operand("gelu_forward", "y", y, x.dtype(), stream, x.numel());
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(
      launch::gelu_erf_forward(detail::config_of(stream), x.dtype(), x.raw_data(), y.raw_data(), x.numel()));
}

void gelu_backward(const Tensor& gy, const Tensor& x, Tensor& dx, Stream stream) {
  check_float("gelu_backward", "x", x);
  check_operand("gelu_backward", "x", x, x.dtype(), stream);
  check_operand("gelu_backward", "gy", gy, x.dtype(), stream, x.numel());
  check_operand("gelu_backward", "dx", dx, x.dtype(), stream, x.numel());
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::gelu_erf_backward(detail::config_of(stream), x.dtype(), gy.raw_data(), x.raw_data(),
                                            dx.raw_data(), x.numel()));
}

}  // namespace cz::cuda
