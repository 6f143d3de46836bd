// Host wrappers of the LayerNorm kernels (layer_norm.cu): argument checks, device guard, the backward
// pass's partial-sum workspace from the caching allocator, launch status.
#include <utility>

#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {

using detail::check_float;
using detail::check_operand;

namespace {

// LayerNorm's common checks: x (..., C) floating on the stream's device, mean and rstd one statistic per row
// in stat_dtype. Returns (rows, C).
std::pair<int64_t, int64_t> check_layer_norm_rows(const char* op, const Tensor& x, const Tensor& mean,
                                                  const Tensor& rstd, Stream stream) {
  check_float(op, "x", x);
  check_operand(op, "x", x, x.dtype(), stream);
  CZ_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) > 0, "cuda::{}: x has shape {}", op, shape_str(x.sizes()));
  const int64_t c = x.size(-1), rows = x.numel() / c;
  check_operand(op, "mean", mean, stat_dtype(x.dtype()), stream, rows);
  check_operand(op, "rstd", rstd, stat_dtype(x.dtype()), stream, rows);
  return {rows, c};
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                        Tensor& mean, Tensor& rstd, Stream stream) {
  constexpr const char* op = "layer_norm_forward";
  const auto [rows, c] = check_layer_norm_rows(op, x, mean, rstd, stream);
  const DType t = x.dtype();
  check_operand(op, "y", y, t, stream, x.numel());
  for (const Tensor* p : {&weight, &bias})
    if (p->defined()) check_operand(op, "weight/bias", *p, t, stream, c);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::layer_norm_forward(detail::config_of(stream), t, x.raw_data(),
                                             weight.defined() ? weight.raw_data() : nullptr,
                                             bias.defined() ? bias.raw_data() : nullptr, eps, y.raw_data(),
                                             mean.raw_data(), rstd.raw_data(), rows, c));
}

void layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias, Stream stream) {
  constexpr const char* op = "layer_norm_backward";
  const auto [rows, c] = check_layer_norm_rows(op, x, mean, rstd, stream);
  const DType t = x.dtype();
  check_operand(op, "gy", gy, t, stream, x.numel());
  if (weight.defined()) check_operand(op, "weight", weight, t, stream, c);
  if (dx.defined()) check_operand(op, "dx", dx, t, stream, x.numel());
  for (const Tensor* p : {&dweight, &dbias})
    if (p->defined()) {
      CZ_CHECK(weight.defined() || p == &dbias, "cuda::{}: dweight needs a weight", op);
      check_operand(op, "dweight/dbias", *p, t, stream, c);
    }
  DeviceGuard guard(stream.device.index);
  const launch::Config cfg = detail::config_of(stream);
  DataPtr ws;
  if (dweight.defined() || dbias.defined())
    ws = allocate(launch::layer_norm_backward_workspace(t, rows, c, cfg.sm_count), stream);
  CZ_CHECK_STATUS(launch::layer_norm_backward(
      cfg, t, gy.raw_data(), x.raw_data(), weight.defined() ? weight.raw_data() : nullptr, mean.raw_data(),
      rstd.raw_data(), dx.defined() ? dx.raw_data() : nullptr,
      dweight.defined() ? dweight.raw_data() : nullptr, dbias.defined() ? dbias.raw_data() : nullptr, rows, c,
      ws.get()));
}

}  // namespace cz::cuda
