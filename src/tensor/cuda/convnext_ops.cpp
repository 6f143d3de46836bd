// Host wrappers of the ConvNeXt op kernels (gelu.cu, layer_norm.cu, pool.cu, loss.cu, drop_path.cu): argument
// checks, device guard, workspaces from the caching allocator, launch status. Convolutions are in conv.cpp.
#include <utility>

#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {

DType stat_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

namespace {

using detail::check_float;
using detail::check_operand;

void check_numel(const char* op, const char* what, const Tensor& t, int64_t numel) {
  CZ_CHECK_SHAPE(t.numel() == numel, "cuda::{}: {} has shape {} ({} elements), expected {} elements", op,
                 what, shape_str(t.sizes()), t.numel(), numel);
}

// LayerNorm's common checks: x (..., C) floating on the stream's device, mean and rstd one statistic per row
// in stat_dtype. Returns (rows, C).
std::pair<int64_t, int64_t> check_layer_norm_rows(const char* op, const Tensor& x, const Tensor& mean,
                                                  const Tensor& rstd, Stream stream) {
  check_float(op, "x", x);
  check_operand(op, "x", x, x.dtype(), stream);
  CZ_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) > 0, "cuda::{}: x has shape {}", op, shape_str(x.sizes()));
  const int64_t c = x.size(-1), rows = x.numel() / c;
  check_operand(op, "mean", mean, stat_dtype(x.dtype()), stream);
  check_operand(op, "rstd", rstd, stat_dtype(x.dtype()), stream);
  check_numel(op, "mean", mean, rows);
  check_numel(op, "rstd", rstd, rows);
  return {rows, c};
}

}  // namespace

void gelu_forward(const Tensor& x, Tensor& y, Stream stream) {
  check_float("gelu_forward", "x", x);
  check_operand("gelu_forward", "x", x, x.dtype(), stream);
  check_operand("gelu_forward", "y", y, x.dtype(), stream);
  check_numel("gelu_forward", "y", y, x.numel());
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(
      launch::gelu_erf_forward(detail::config_of(stream), x.dtype(), x.raw_data(), y.raw_data(), x.numel()));
}

void gelu_backward(const Tensor& gy, const Tensor& x, Tensor& dx, Stream stream) {
  check_float("gelu_backward", "x", x);
  check_operand("gelu_backward", "gy", gy, x.dtype(), stream);
  check_operand("gelu_backward", "x", x, x.dtype(), stream);
  check_operand("gelu_backward", "dx", dx, x.dtype(), stream);
  check_numel("gelu_backward", "gy", gy, x.numel());
  check_numel("gelu_backward", "dx", dx, x.numel());
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::gelu_erf_backward(detail::config_of(stream), x.dtype(), gy.raw_data(), x.raw_data(),
                                            dx.raw_data(), x.numel()));
}

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                        Tensor& mean, Tensor& rstd, Stream stream) {
  constexpr const char* op = "layer_norm_forward";
  const auto [rows, c] = check_layer_norm_rows(op, x, mean, rstd, stream);
  const DType t = x.dtype();
  check_operand(op, "y", y, t, stream);
  check_numel(op, "y", y, x.numel());
  for (const Tensor* p : {&weight, &bias})
    if (p->defined()) {
      check_operand(op, "weight/bias", *p, t, stream);
      check_numel(op, "weight/bias", *p, c);
    }
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
  check_operand(op, "gy", gy, t, stream);
  check_numel(op, "gy", gy, x.numel());
  if (weight.defined()) {
    check_operand(op, "weight", weight, t, stream);
    check_numel(op, "weight", weight, c);
  }
  if (dx.defined()) {
    check_operand(op, "dx", dx, t, stream);
    check_numel(op, "dx", dx, x.numel());
  }
  for (const Tensor* p : {&dweight, &dbias})
    if (p->defined()) {
      CZ_CHECK(weight.defined() || p == &dbias, "cuda::{}: dweight needs a weight", op);
      check_operand(op, "dweight/dbias", *p, t, stream);
      check_numel(op, "dweight/dbias", *p, c);
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

namespace {

void check_logits_labels(const char* op, const Tensor& logits, const Tensor& labels, Stream stream) {
  check_float(op, "logits", logits);
  check_operand(op, "logits", logits, logits.dtype(), stream);
  CZ_CHECK_SHAPE(logits.dim() == 2 && logits.size(0) > 0 && logits.size(1) > 0,
                 "cuda::{}: logits have shape {}", op, shape_str(logits.sizes()));
  detail::check_on(op, "labels", labels, stream);
  CZ_CHECK_DTYPE(labels.dtype() == DType::i32 || labels.dtype() == DType::i64,
                 "cuda::{}: labels must be i32 or i64, got {}", op, dtype_name(labels.dtype()));
  CZ_CHECK_SHAPE(labels.is_contiguous() && labels.numel() == logits.size(0),
                 "cuda::{}: labels have shape {} for logits {}", op, shape_str(labels.sizes()),
                 shape_str(logits.sizes()));
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, double smoothing, Tensor& loss,
                           Tensor& lse, Stream stream) {
  constexpr const char* op = "cross_entropy_forward";
  check_logits_labels(op, logits, labels, stream);
  const DType t = logits.dtype();
  const int64_t n = logits.size(0), k = logits.size(1);
  check_operand(op, "loss", loss, t, stream);
  check_numel(op, "loss", loss, 1);
  check_operand(op, "lse", lse, stat_dtype(t), stream);
  check_numel(op, "lse", lse, n);
  DeviceGuard guard(stream.device.index);
  DataPtr ws = allocate(launch::cross_entropy_workspace(t, n), stream);
  CZ_CHECK_STATUS(launch::cross_entropy_forward(detail::config_of(stream), t, labels.dtype(),
                                                logits.raw_data(), labels.raw_data(), smoothing,
                                                loss.raw_data(), lse.raw_data(), n, k, ws.get()));
}

void cross_entropy_backward(const Tensor& gloss, const Tensor& logits, const Tensor& labels,
                            const Tensor& lse, double smoothing, Tensor& dlogits, Stream stream) {
  constexpr const char* op = "cross_entropy_backward";
  check_logits_labels(op, logits, labels, stream);
  const DType t = logits.dtype();
  const int64_t n = logits.size(0), k = logits.size(1);
  check_operand(op, "gloss", gloss, t, stream);
  check_numel(op, "gloss", gloss, 1);
  check_operand(op, "lse", lse, stat_dtype(t), stream);
  check_numel(op, "lse", lse, n);
  check_operand(op, "dlogits", dlogits, t, stream);
  check_numel(op, "dlogits", dlogits, n * k);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::cross_entropy_backward(detail::config_of(stream), t, labels.dtype(),
                                                 gloss.raw_data(), logits.raw_data(), labels.raw_data(),
                                                 lse.raw_data(), smoothing, dlogits.raw_data(), n, k));
}

void argmax(const Tensor& x, Tensor& out, Stream stream) {
  check_float("argmax", "x", x);
  check_operand("argmax", "x", x, x.dtype(), stream);
  CZ_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) > 0, "cuda::argmax: x has shape {}", shape_str(x.sizes()));
  const int64_t k = x.size(-1), rows = x.numel() / k;
  check_operand("argmax", "out", out, DType::i64, stream);
  check_numel("argmax", "out", out, rows);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::argmax(detail::config_of(stream), x.dtype(), x.raw_data(),
                                 static_cast<int64_t*>(out.raw_data()), rows, k));
}

void sample_scale(const Tensor& x, const Tensor& scale, Tensor& y, Stream stream) {
  check_float("sample_scale", "x", x);
  check_operand("sample_scale", "x", x, x.dtype(), stream);
  check_operand("sample_scale", "scale", scale, x.dtype(), stream);
  check_operand("sample_scale", "y", y, x.dtype(), stream);
  CZ_CHECK_SHAPE(x.dim() >= 1, "cuda::sample_scale: x has shape {}", shape_str(x.sizes()));
  const int64_t n = x.size(0);
  check_numel("sample_scale", "scale", scale, n);
  check_numel("sample_scale", "y", y, x.numel());
  if (n == 0) return;
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::sample_scale(detail::config_of(stream), x.dtype(), x.raw_data(), scale.raw_data(),
                                       y.raw_data(), x.numel(), x.numel() / n));
}

}  // namespace cz::cuda
