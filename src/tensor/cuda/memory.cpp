// Host wrappers of the memory kernels: fill, copy (any strides and dtype pair), axpy and scale.
#include <cstring>

#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {
namespace {

// The destination dtype's bit pattern for `value`, converted exactly as cpu::fill converts it.
uint64_t value_bits(DType t, double value) {
  return visit_dtype(t, [&](auto tag) -> uint64_t {
    using T = decltype(tag);
    T v;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      v = T(float(value));
    else if constexpr (std::is_same_v<T, bool>)
      v = value != 0.0;
    else
      v = static_cast<T>(value);
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
  });
}

}  // namespace

void fill(Tensor& dst, double value, Stream stream) {
  detail::check_on("fill", "dst", dst, stream);
  DeviceGuard guard(stream.device.index);
  const auto g = detail::geometry<1>("fill", dst.sizes(), {&dst.strides()});
  const uint64_t bits = value_bits(dst.dtype(), value);
  CZ_CHECK_STATUS(launch::fill(detail::config_of(stream), dst.dtype(), dst.raw_data(), bits, g, dst.numel()));
}

void copy(const Tensor& src, Tensor& dst, Stream stream) {
  detail::check_on("copy", "src", src, stream);
  detail::check_on("copy", "dst", dst, stream);
  CZ_CHECK_SHAPE(src.sizes() == dst.sizes(), "cuda::copy: shapes {} and {} differ", shape_str(src.sizes()),
                 shape_str(dst.sizes()));
  DeviceGuard guard(stream.device.index);
  const auto g = detail::geometry<2>("copy", dst.sizes(), {&dst.strides(), &src.strides()});
  CZ_CHECK_STATUS(launch::copy(detail::config_of(stream), src.dtype(), src.raw_data(), dst.dtype(),
                               dst.raw_data(), g, dst.numel()));
}

void axpy(const Tensor& x, double alpha, Tensor& y, Stream stream) {
  detail::check_on("axpy", "x", x, stream);
  detail::check_on("axpy", "y", y, stream);
  detail::check_float("axpy", "y", y);
  CZ_CHECK_DTYPE(x.dtype() == y.dtype(), "cuda::axpy: dtypes {} and {}", dtype_name(x.dtype()),
                 dtype_name(y.dtype()));
  CZ_CHECK_SHAPE(x.sizes() == y.sizes(), "cuda::axpy: shapes {} and {} differ", shape_str(x.sizes()),
                 shape_str(y.sizes()));
  DeviceGuard guard(stream.device.index);
  const auto g = detail::geometry<2>("axpy", y.sizes(), {&y.strides(), &x.strides()});
  CZ_CHECK_STATUS(
      launch::axpy(detail::config_of(stream), y.dtype(), x.raw_data(), alpha, y.raw_data(), g, y.numel()));
}

void scale(Tensor& x, double factor, Stream stream) {
  detail::check_on("scale", "x", x, stream);
  detail::check_float("scale", "x", x);
  DeviceGuard guard(stream.device.index);
  const auto g = detail::geometry<1>("scale", x.sizes(), {&x.strides()});
  CZ_CHECK_STATUS(launch::scale(detail::config_of(stream), x.dtype(), x.raw_data(), factor, g, x.numel()));
}

void busy_wait(Stream stream, double microseconds) {
  CZ_CHECK_DEVICE(stream.device.is_cuda(), "cuda::busy_wait: {} is not a CUDA stream", stream.device.str());
  CZ_CHECK(microseconds >= 0, "cuda::busy_wait: negative duration {}", microseconds);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::busy_wait(detail::config_of(stream), int64_t(microseconds * 1000.0)));
}

}  // namespace cz::cuda
