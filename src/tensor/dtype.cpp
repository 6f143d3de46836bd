// DType names and sizes.
#include "tensor/dtype.h"

#include <array>

#include "tensor/check.h"

namespace cz {

namespace {

template <size_t... I>
constexpr std::array<size_t, sizeof...(I)> sizes_of(std::index_sequence<I...>) {
  return {sizeof(std::tuple_element_t<I, DTypeTypes>)...};
}

// A table: the tensor code asks for sizes everywhere (raw_data, nbytes), so one load, not visit_dtype's
// tests.
constexpr auto kSizes = sizes_of(std::make_index_sequence<std::tuple_size_v<DTypeTypes>>{});

}  // namespace

size_t dtype_size(DType t) {
  return size_t(t) < kSizes.size() ? kSizes[size_t(t)] : 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::b8:
      return "bool";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (DType t :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::b8})
    if (dtype_name(t) == name) return t;
  if (name == "float32" || name == "float") return DType::f32;
  if (name == "float64" || name == "double") return DType::f64;
  if (name == "float16" || name == "half" || name == "fp16") return DType::f16;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  throw DtypeError(
      fmt::format("unknown dtype '{}' (expected f32, f64, f16, bf16, i32, i64, u8 or bool)", name));
}

}  // namespace cz
