// Element types. f16/bf16 are storage types on the CPU (compute in f32); f64 exists for gradient checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tensor/half.h"

namespace cz {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8, b8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
DType dtype_from_name(std::string_view name);  // throws DtypeError naming the unknown name
inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::f16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::b8;
};
template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

// Calls f with a value of the C++ type for `t` (e.g. `[&](auto tag) { using T = decltype(tag); ... }`).
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::f16:
      return f(Half{});
    case DType::bf16:
      return f(BFloat16{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::u8:
      return f(uint8_t{});
    case DType::b8:
      return f(bool{});
  }
  return f(float{});
}

}  // namespace cz
