// f16/bf16 conversion: exhaustive round trips and rounding against exact arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace cz {
namespace {

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    Half h;
    h.bits = uint16_t(b);
    const float f = h;
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(float(Half(f)))) << b;
      continue;
    }
    EXPECT_EQ(Half(f).bits, b) << "bits " << b << " value " << f;
  }
}

TEST(Half, RoundsToNearestEven) {
  // Between 1 and the next half (1 + 2^-10): the midpoint ties to even (1), just above rounds up.
  EXPECT_EQ(float(Half(1.0f + 0x1p-11f)), 1.0f);
  EXPECT_EQ(float(Half(1.0f + 0x1p-11f + 0x1p-20f)), 1.0f + 0x1p-10f);
  EXPECT_EQ(float(Half(1.0f + 3 * 0x1p-11f)), 1.0f + 2 * 0x1p-10f);  // tie, odd below -> up
  EXPECT_EQ(float(Half(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(float(Half(65520.0f))));
  EXPECT_EQ(float(Half(65519.0f)), 65504.0f);
  EXPECT_EQ(float(Half(0x1p-24f)), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(float(Half(0x1p-25f)), 0.0f);      // tie to even -> 0
  EXPECT_EQ(float(Half(0x1.8p-25f)), 0x1p-24f);
  EXPECT_EQ(float(Half(-3 * 0x1p-24f)), -3 * 0x1p-24f);
}

TEST(BFloat16, RoundTripAndRounding) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    BFloat16 h;
    h.bits = uint16_t(b);
    const float f = h;
    if (std::isnan(f)) continue;
    EXPECT_EQ(BFloat16(f).bits, b);
  }
  EXPECT_EQ(float(BFloat16(1.0f + 0x1p-8f)), 1.0f);                // tie -> even
  EXPECT_EQ(float(BFloat16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);  // tie, odd -> up
  EXPECT_EQ(float(BFloat16(1.0f + 0x1p-8f + 0x1p-12f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(float(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

// DTypeTypes, the one list of element types: each dtype's C++ type maps back to it and has its size.
TEST(DType, EachDTypeVisitsItsOwnType) {
  const std::pair<DType, size_t> sizes[] = {{DType::f32, 4},  {DType::f64, 8}, {DType::f16, 2},
                                            {DType::bf16, 2}, {DType::i32, 4}, {DType::i64, 8},
                                            {DType::u8, 1},   {DType::b8, 1}};
  for (const auto& [t, bytes] : sizes) {
    SCOPED_TRACE(dtype_name(t));
    EXPECT_EQ(dtype_size(t), bytes);
    visit_dtype(t, [&](auto v) {
      using T = decltype(v);
      EXPECT_EQ(dtype_of<T>, t);
      EXPECT_EQ(sizeof(T), bytes);
      constexpr bool floating =
          std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
      EXPECT_EQ(is_floating(t), floating);
    });
  }
  static_assert(dtype_of<BFloat16> == DType::bf16 && dtype_of<bool> == DType::b8);
}

TEST(DType, TensorConversionsGoThroughF32) {
  Tensor x = from_vector<double>({1.5, -2.25, 3.0e-3, 1.0e5}, {4});
  EXPECT_EQ(x.to(DType::bf16).to(DType::f64).to_vector<double>(),
            (std::vector<double>{1.5, -2.25, float(BFloat16(3.0e-3f)), float(BFloat16(1.0e5f))}));
  EXPECT_TRUE(std::isinf(x.to(DType::f16).to(DType::f32).to_vector<float>()[3]));  // above f16's range
  EXPECT_EQ(x.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 0, 100000}));
  EXPECT_THROW(dtype_from_name("f8"), DtypeError);
}

}  // namespace
}  // namespace cz
