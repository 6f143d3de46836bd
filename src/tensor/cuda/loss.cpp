// Host wrappers of the cross-entropy (hard and soft targets) and argmax kernels (loss.cu): argument checks,
// device guard, the forward pass's workspace from the caching allocator, launch status.
#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {

using detail::check_float;
using detail::check_operand;

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
  check_operand(op, "loss", loss, t, stream, 1);
  check_operand(op, "lse", lse, stat_dtype(t), stream, n);
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
  check_operand(op, "gloss", gloss, t, stream, 1);
  check_operand(op, "lse", lse, stat_dtype(t), stream, n);
  check_operand(op, "dlogits", dlogits, t, stream, n * k);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::cross_entropy_backward(detail::config_of(stream), t, labels.dtype(),
                                                 gloss.raw_data(), logits.raw_data(), labels.raw_data(),
                                                 lse.raw_data(), smoothing, dlogits.raw_data(), n, k));
}

void soft_target_cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                                       Tensor& tsum, Stream stream) {
  constexpr const char* op = "soft_target_cross_entropy_forward";
  check_float(op, "logits", logits);
  check_operand(op, "logits", logits, logits.dtype(), stream);
  CZ_CHECK_SHAPE(logits.dim() == 2 && logits.size(0) > 0 && logits.size(1) > 0,
                 "cuda::{}: logits have shape {}", op, shape_str(logits.sizes()));
  const DType t = logits.dtype();
  const int64_t n = logits.size(0), k = logits.size(1);
  check_operand(op, "targets", targets, t, stream, n * k);
  check_operand(op, "loss", loss, t, stream, 1);
  check_operand(op, "lse", lse, stat_dtype(t), stream, n);
  check_operand(op, "tsum", tsum, stat_dtype(t), stream, n);
  DeviceGuard guard(stream.device.index);
  DataPtr ws = allocate(launch::cross_entropy_workspace(t, n), stream);
  CZ_CHECK_STATUS(launch::soft_target_cross_entropy_forward(detail::config_of(stream), t, logits.raw_data(),
                                                            targets.raw_data(), loss.raw_data(),
                                                            lse.raw_data(), tsum.raw_data(), n, k, ws.get()));
}

void soft_target_cross_entropy_backward(const Tensor& gloss, const Tensor& logits, const Tensor& targets,
                                        const Tensor& lse, const Tensor& tsum, Tensor& dlogits,
                                        Tensor& dtargets, Stream stream) {
  constexpr const char* op = "soft_target_cross_entropy_backward";
  check_float(op, "logits", logits);
  check_operand(op, "logits", logits, logits.dtype(), stream);
  CZ_CHECK_SHAPE(logits.dim() == 2, "cuda::{}: logits have shape {}", op, shape_str(logits.sizes()));
  const DType t = logits.dtype();
  const int64_t n = logits.size(0), k = logits.size(1);
  check_operand(op, "targets", targets, t, stream, n * k);
  check_operand(op, "gloss", gloss, t, stream, 1);
  check_operand(op, "lse", lse, stat_dtype(t), stream, n);
  check_operand(op, "tsum", tsum, stat_dtype(t), stream, n);
  for (Tensor* g : {&dlogits, &dtargets})
    if (g->defined()) check_operand(op, g == &dlogits ? "dlogits" : "dtargets", *g, t, stream, n * k);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::soft_target_cross_entropy_backward(
      detail::config_of(stream), t, gloss.raw_data(), logits.raw_data(), targets.raw_data(), lse.raw_data(),
      tsum.raw_data(), dlogits.defined() ? dlogits.raw_data() : nullptr,
      dtargets.defined() ? dtargets.raw_data() : nullptr, n, k));
}

void argmax(const Tensor& x, Tensor& out, Stream stream) {
  check_float("argmax", "x", x);
  check_operand("argmax", "x", x, x.dtype(), stream);
  CZ_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) > 0, "cuda::argmax: x has shape {}", shape_str(x.sizes()));
  const int64_t k = x.size(-1), rows = x.numel() / k;
  check_operand("argmax", "out", out, DType::i64, stream, rows);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::argmax(detail::config_of(stream), x.dtype(), x.raw_data(),
                                 static_cast<int64_t*>(out.raw_data()), rows, k));
}

}  // namespace cz::cuda
