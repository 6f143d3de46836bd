// Element types. f16/bf16 are storage types on the CPU (compute in f32); f64 exists for gradient checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tensor/half.h"

namespace cz {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8, b8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
DType dtype_from_name(std::string_view name);  // throws DtypeError naming the unknown name
inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

// The C++ type of each dtype, in DType's order: the one list dtype_of and visit_dtype read.
using DTypeTypes = std::tuple<float, double, Half, BFloat16, int32_t, int64_t, uint8_t, bool>;

namespace detail {
template <class T, size_t I = 0>
constexpr DType dtype_at() {
  static_assert(I < std::tuple_size_v<DTypeTypes>, "dtype_of: not an element type");
  if constexpr (std::is_same_v<T, std::tuple_element_t<I, DTypeTypes>>)
    return DType(I);
  else
    return dtype_at<T, I + 1>();
}
}  // namespace detail

template <class T>
inline constexpr DType dtype_of = detail::dtype_at<T>();

// Calls f with a value of the C++ type for `t` (e.g. `[&](auto tag) { using T = decltype(tag); ... }`).
template <size_t I = 0, class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  if constexpr (I + 1 < std::tuple_size_v<DTypeTypes>)
    if (size_t(t) != I) return visit_dtype<I + 1>(t, std::forward<F>(f));
  return f(std::tuple_element_t<I, DTypeTypes>{});
}

}  // namespace cz
