// Host wrappers of the elementwise kernels: binary ops and the per-channel (layer scale) forward and
// backward.
#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {

void binary(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out, Stream stream) {
  detail::check_float("binary", "out", out);
  detail::check_operand("binary", "a", a, out.dtype(), stream);
  detail::check_operand("binary", "b", b, out.dtype(), stream);
  detail::check_operand("binary", "out", out, out.dtype(), stream);
  CZ_CHECK_SHAPE(a.numel() == out.numel() && b.numel() == out.numel(), "cuda::binary: {}, {} and {} elements",
                 a.numel(), b.numel(), out.numel());
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::binary(detail::config_of(stream), out.dtype(), op, a.raw_data(), b.raw_data(),
                                 alpha, out.raw_data(), out.numel()));
}

void residual_scale_add(const Tensor& residual, const Tensor& x, const Tensor& gamma, Tensor& out,
                        Stream stream) {
  detail::check_float("residual_scale_add", "out", out);
  detail::check_operand("residual_scale_add", "x", x, out.dtype(), stream);
  detail::check_operand("residual_scale_add", "gamma", gamma, out.dtype(), stream);
  detail::check_operand("residual_scale_add", "out", out, out.dtype(), stream);
  if (residual.defined())
    detail::check_operand("residual_scale_add", "residual", residual, out.dtype(), stream);
  const int64_t c = gamma.numel();
  CZ_CHECK_SHAPE(x.numel() == out.numel() && (!residual.defined() || residual.numel() == out.numel()) &&
                     x.dim() >= 1 && x.size(-1) == c,
                 "cuda::residual_scale_add: x {}, gamma {}, out {}", shape_str(x.sizes()),
                 shape_str(gamma.sizes()), shape_str(out.sizes()));
  if (out.numel() == 0) return;
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::residual_scale_add(detail::config_of(stream), out.dtype(),
                                             residual.defined() ? residual.raw_data() : nullptr, x.raw_data(),
                                             gamma.raw_data(), out.raw_data(), out.numel(), c));
}

void channel_scale_backward(const Tensor& g, const Tensor& x, const Tensor& gamma, Tensor& dx, Tensor& dgamma,
                            Stream stream) {
  detail::check_float("channel_scale_backward", "g", g);
  const DType t = g.dtype();
  detail::check_operand("channel_scale_backward", "g", g, t, stream);
  detail::check_operand("channel_scale_backward", "x", x, t, stream);
  detail::check_operand("channel_scale_backward", "gamma", gamma, t, stream);
  const int64_t c = gamma.numel();
  CZ_CHECK_SHAPE(g.sizes() == x.sizes() && g.dim() >= 1 && g.size(-1) == c,
                 "cuda::channel_scale_backward: g {}, x {}, gamma {}", shape_str(g.sizes()),
                 shape_str(x.sizes()), shape_str(gamma.sizes()));
  if (dx.defined()) {
    detail::check_operand("channel_scale_backward", "dx", dx, t, stream);
    CZ_CHECK_SHAPE(dx.numel() == g.numel(), "cuda::channel_scale_backward: dx {} for g {}",
                   shape_str(dx.sizes()), shape_str(g.sizes()));
  }
  if (dgamma.defined()) {
    detail::check_operand("channel_scale_backward", "dgamma", dgamma, t, stream);
    CZ_CHECK_SHAPE(dgamma.numel() == c, "cuda::channel_scale_backward: dgamma {} for C={}",
                   shape_str(dgamma.sizes()), c);
  }
  DeviceGuard guard(stream.device.index);
  const launch::Config cfg = detail::config_of(stream);
  if (dx.defined() && g.numel() > 0)
    CZ_CHECK_STATUS(launch::residual_scale_add(cfg, t, nullptr, g.raw_data(), gamma.raw_data(), dx.raw_data(),
                                               g.numel(), c));
  if (dgamma.defined() && c > 0) {
    const int64_t rows = g.numel() / c;
    DataPtr ws = allocate(launch::column_sums_workspace(t, rows, c, cfg.sm_count), stream);
    CZ_CHECK_STATUS(
        launch::column_sums(cfg, t, g.raw_data(), x.raw_data(), rows, c, dgamma.raw_data(), ws.get()));
  }
}

}  // namespace cz::cuda
