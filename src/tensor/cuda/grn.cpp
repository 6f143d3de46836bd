// Host wrappers of the GRN kernels (grn.cu): argument checks, device guard, the backward pass's per-image
// sums workspace from the caching allocator, launch status.
#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {

using detail::check_float;
using detail::check_operand;

namespace {

struct GrnShape {
  int64_t n, hw, c;
};

// x (N, H, W, C) floating on the stream's device; gamma (C) like x; gx (N, C) and d (N) in stat_dtype.
GrnShape check_grn(const char* op, const Tensor& x, const Tensor& gamma, const Tensor& gx, const Tensor& d,
                   Stream stream) {
  check_float(op, "x", x);
  check_operand(op, "x", x, x.dtype(), stream);
  CZ_CHECK_SHAPE(x.dim() == 4, "cuda::{}: x has shape {}, expected (N, H, W, C)", op, shape_str(x.sizes()));
  const GrnShape s{x.size(0), x.size(1) * x.size(2), x.size(3)};
  check_operand(op, "gamma", gamma, x.dtype(), stream, s.c);
  check_operand(op, "gx", gx, stat_dtype(x.dtype()), stream, s.n * s.c);
  check_operand(op, "d", d, stat_dtype(x.dtype()), stream, s.n);
  return s;
}

}  // namespace

void grn_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& gx,
                 Tensor& d, Stream stream) {
  constexpr const char* op = "grn_forward";
  const GrnShape s = check_grn(op, x, gamma, gx, d, stream);
  check_operand(op, "beta", beta, x.dtype(), stream, s.c);
  check_operand(op, "y", y, x.dtype(), stream, x.numel());
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::grn_forward(detail::config_of(stream), x.dtype(), x.raw_data(), gamma.raw_data(),
                                      beta.raw_data(), eps, y.raw_data(), gx.raw_data(), d.raw_data(), s.n,
                                      s.hw, s.c));
}

void grn_backward(const Tensor& gy, const Tensor& x, const Tensor& gamma, const Tensor& gx, const Tensor& d,
                  Tensor& dx, Tensor& dgamma, Tensor& dbeta, Stream stream) {
  constexpr const char* op = "grn_backward";
  const GrnShape s = check_grn(op, x, gamma, gx, d, stream);
  check_operand(op, "gy", gy, x.dtype(), stream, x.numel());
  if (dx.defined()) check_operand(op, "dx", dx, x.dtype(), stream, x.numel());
  for (const Tensor* p : {&dgamma, &dbeta})
    if (p->defined()) check_operand(op, "dgamma/dbeta", *p, x.dtype(), stream, s.c);
  if (!dx.defined() && !dgamma.defined() && !dbeta.defined()) return;
  DeviceGuard guard(stream.device.index);
  DataPtr ws;
  if (s.n * s.c > 0) ws = allocate(launch::grn_backward_workspace(x.dtype(), s.n, s.c), stream);
  CZ_CHECK_STATUS(launch::grn_backward(
      detail::config_of(stream), x.dtype(), gy.raw_data(), x.raw_data(), gamma.raw_data(), gx.raw_data(),
      d.raw_data(), dx.defined() ? dx.raw_data() : nullptr, dgamma.defined() ? dgamma.raw_data() : nullptr,
      dbeta.defined() ? dbeta.raw_data() : nullptr, s.n, s.hw, s.c, ws.get()));
}

}  // namespace cz::cuda
