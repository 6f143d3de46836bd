// Every op in the table: f64 and f32 results against the naive reference, and the f64 gradient check.
#include <gtest/gtest.h>

#include "op_table.h"
#include "tensor/autograd/engine.h"

namespace cz::testing {
namespace {

class OpTable : public ::testing::TestWithParam<size_t> {
 protected:
  const OpCase& op() const { return op_cases()[GetParam()]; }
};

std::vector<Tensor> detached(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(t.detach());
  return out;
}

TEST_P(OpTable, F64MatchesReference) {
  const auto in = op().inputs(DType::f64, 11);
  NoGradGuard no_grad;
  EXPECT_TRUE(all_close(op().fn(in), op().reference(detached(in)), 1e-10, 1e-12));
}

TEST_P(OpTable, F32MatchesReference) {
  const auto in64 = op().inputs(DType::f64, 12);
  std::vector<Tensor> in32;
  for (const Tensor& t : in64) in32.push_back(is_floating(t.dtype()) ? t.detach().to(DType::f32) : t);
  NoGradGuard no_grad;
  const Tensor out = op().fn(in32);
  EXPECT_EQ(out.dtype(), DType::f32);
  EXPECT_TRUE(all_close(out, op().reference(detached(in64)), op().f32_rtol, op().f32_atol));
}

TEST_P(OpTable, GradientMatchesFiniteDifferences) {
  const auto in = op().inputs(DType::f64, 13);
  EXPECT_TRUE(gradcheck(op().fn, in, 1e-6, op().grad_atol, op().grad_rtol));
}

// The f32 backward kernels (other vector widths than f64) against the f64 ones the gradient check validated.
TEST_P(OpTable, F32GradientsMatchF64) {
  const auto in64 = op().inputs(DType::f64, 14);
  std::vector<Tensor> in32;
  for (const Tensor& t : in64)
    in32.push_back(is_floating(t.dtype()) ? t.detach().to(DType::f32) : t.detach());
  const auto g64 = output_and_grads(op().fn, in64), g32 = output_and_grads(op().fn, in32);
  ASSERT_EQ(g64.size(), g32.size());
  for (size_t i = 0; i < g64.size(); ++i)
    EXPECT_TRUE(all_close(g32[i], g64[i], 10 * op().f32_rtol, 10 * op().f32_atol)) << "output/gradient " << i;
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  return op_cases()[info.param].name;
}

INSTANTIATE_TEST_SUITE_P(All, OpTable, ::testing::Range<size_t>(0, op_cases().size()), case_name);

}  // namespace
}  // namespace cz::testing
