// Host wrappers of the reductions: sum (and mean, via factor) and the broadcast of their backward.
#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {

void sum(const Tensor& x, double factor, Tensor& out, Stream stream) {
  detail::check_float("sum", "x", x);
  detail::check_operand("sum", "x", x, x.dtype(), stream);
  detail::check_operand("sum", "out", out, x.dtype(), stream);
  CZ_CHECK_SHAPE(out.numel() == 1, "cuda::sum: out has {} elements, expected 1", out.numel());
  DeviceGuard guard(stream.device.index);
  const launch::Config cfg = detail::config_of(stream);
  DataPtr ws = allocate(launch::sum_workspace(x.dtype(), x.numel(), cfg.sm_count), stream);
  CZ_CHECK_STATUS(launch::sum(cfg, x.dtype(), x.raw_data(), x.numel(), factor, out.raw_data(), ws.get()));
}

void broadcast_scalar(const Tensor& scalar, double factor, Tensor& out, Stream stream) {
  detail::check_float("broadcast_scalar", "out", out);
  detail::check_on("broadcast_scalar", "scalar", scalar, stream);
  CZ_CHECK_DTYPE(scalar.dtype() == out.dtype(), "cuda::broadcast_scalar: scalar is {} but out is {}",
                 dtype_name(scalar.dtype()), dtype_name(out.dtype()));
  CZ_CHECK_SHAPE(scalar.numel() == 1, "cuda::broadcast_scalar: scalar has {} elements", scalar.numel());
  detail::check_operand("broadcast_scalar", "out", out, out.dtype(), stream);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::broadcast_scalar(detail::config_of(stream), out.dtype(), scalar.raw_data(), factor,
                                           out.raw_data(), out.numel()));
}

}  // namespace cz::cuda
