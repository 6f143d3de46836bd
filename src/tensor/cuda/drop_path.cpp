// Host wrapper of drop path's per-sample scale kernel (drop_path.cu): argument checks, device guard, launch
// status.
#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {

using detail::check_float;
using detail::check_operand;

void sample_scale(const Tensor& x, const Tensor& scale, Tensor& y, Stream stream) {
  check_float("sample_scale", "x", x);
  check_operand("sample_scale", "x", x, x.dtype(), stream);
  CZ_CHECK_SHAPE(x.dim() >= 1, "cuda::sample_scale: x has shape {}", shape_str(x.sizes()));
  const int64_t n = x.size(0);
  check_operand("sample_scale", "scale", scale, x.dtype(), stream, n);
  check_operand("sample_scale", "y", y, x.dtype(), stream, x.numel());
  if (n == 0) return;
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::sample_scale(detail::config_of(stream), x.dtype(), x.raw_data(), scale.raw_data(),
                                       y.raw_data(), x.numel(), x.numel() / n));
}

}  // namespace cz::cuda
