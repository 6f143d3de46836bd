// Flat parameter/gradient buffers: values kept, handles re-pointed, gradients land in the flat buffer.
#include <gtest/gtest.h>

#include "common/gradcheck.h"
#include "tensor/autograd/engine.h"
#include "tensor/flat.h"
#include "tensor/ops.h"

namespace cz {
namespace {

TEST(Flat, ParametersMoveIntoOneAlignedBufferAndKeepTheirValues) {
  Tensor a = testing::random_tensor({3, 5}, 1, DType::f32).set_requires_grad(true);
  Tensor b = testing::random_tensor({7}, 2, DType::f32).set_requires_grad(true);
  const auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  FlatParams flat = flatten_parameters({{"a", a}, {"b", b}}, 16);
  EXPECT_EQ(flat.layout.segments[0].offset, 0);
  EXPECT_EQ(flat.layout.segments[1].offset, 16);
  EXPECT_EQ(flat.layout.numel, 32);
  EXPECT_EQ(a.storage(), flat.params.storage());
  EXPECT_EQ(b.storage(), flat.params.storage());
  EXPECT_EQ(a.to_vector<float>(), av);
  EXPECT_EQ(b.to_vector<float>(), bv);
  EXPECT_EQ(flat.params.to_vector<float>()[15], 0.0f);  // padding stays zero
  EXPECT_EQ(flat.layout.find("b").numel, 7);
  EXPECT_THROW(flat.layout.find("c"), ValueError);

  // Writes through the flat buffer are seen by the parameter, and gradients land in the flat grad buffer.
  {
    NoGradGuard no_grad;
    flat.params.narrow(0, 16, 7).fill_(2.0);
  }
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(7, 2.0f));
  Tensor x = testing::random_tensor({7}, 3, DType::f32);
  sum(mul(b, x)).backward();
  EXPECT_EQ(flat.grads.narrow(0, 16, 7).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(flat.grads.narrow(0, 0, 15).to_vector<float>(), std::vector<float>(15, 0.0f));
}

TEST(Flat, BindParametersRepointsAtAnotherBuffer) {
  Tensor a = testing::random_tensor({2, 2}, 4, DType::f32).set_requires_grad(true);
  FlatParams flat = flatten_parameters({{"a", a}}, 4);
  Tensor other = full({4}, 3.0);
  bind_parameters({{"a", a}}, flat.layout, other);
  EXPECT_EQ(a.storage(), other.storage());
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(4, 3.0f));
  EXPECT_THROW(bind_parameters({{"a", a}}, flat.layout, full({5}, 1.0)), ShapeError);
}

// The trainer's Note [Mixed precision] on the CPU, with f64 standing in for the 16-bit compute copy: after
// binding to a buffer of another dtype the old f32 .grad must not linger (backward would fail adding an f64
// gradient into it); a gradient buffer bound in the new dtype receives the gradients.
TEST(Flat, BindingToAnotherDtypeDropsTheStaleGrad) {
  Tensor a = testing::random_tensor({2, 3}, 5, DType::f32).set_requires_grad(true);
  FlatParams flat = flatten_parameters({{"a", a}}, 4);
  ASSERT_EQ(a.grad().dtype(), DType::f32);
  Tensor copy = flat.params.to(DType::f64);
  bind_parameters({{"a", a}}, flat.layout, copy);
  EXPECT_EQ(a.dtype(), DType::f64);
  EXPECT_FALSE(a.grad().defined());
  Tensor x = testing::random_tensor({2, 3}, 6, DType::f64);
  sum(mul(a, x)).backward();  // threw "axpy: dtypes f64 and f32" with the stale grad
  EXPECT_EQ(a.grad().dtype(), DType::f64);
  EXPECT_EQ(a.grad().to_vector<double>(), x.to_vector<double>());

  Tensor grads = zeros({flat.layout.numel}, DType::f64);
  a.set_grad(view_of_storage(grads, {2, 3}, 0));
  bind_parameters({{"a", a}}, flat.layout, copy);  // same dtype: the bound gradient stays
  EXPECT_EQ(a.grad().storage(), grads.storage());
  sum(mul(a, x)).backward();
  EXPECT_EQ(grads.narrow(0, 0, 6).to_vector<double>(), x.to_vector<double>());
}

TEST(Flat, MixedDtypesAreRefusedWithTheirNames) {
  Tensor a = zeros({2}, DType::f32).set_requires_grad(true);
  Tensor b = zeros({2}, DType::f64).set_requires_grad(true);
  try {
    flatten_parameters({{"stem.0.weight", a}, {"head.fc.bias", b}});
    FAIL();
  } catch (const DtypeError& e) {
    EXPECT_NE(std::string(e.what()).find("head.fc.bias"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cz

namespace cz {
namespace {

// Note [Releasable storage]: released bytes go back to the allocator; views saved before (as autograd saves
// them) read the restored bytes; reading while released is an error.
TEST(ReleasableStorage, BytesReallyGoAndComeBackUnderTheSameIdentity) {
  Allocator& a = allocator_for(Device::cpu());
  Tensor unit = full({1 << 18}, 2.0);  // 1 MiB
  Tensor saved = unit.narrow(0, 10, 5).detach();
  const int64_t held = a.stats().allocated_bytes;
  unit.storage()->release();
  EXPECT_FALSE(unit.storage()->resident());
  EXPECT_EQ(held - a.stats().allocated_bytes, int64_t(round_to_size_class(size_t(1) << 20)));
  EXPECT_THROW(saved.to_vector<float>(), Error);
  unit.storage()->restore(a.allocate(unit.storage()->nbytes()));
  unit.fill_(3.0);
  EXPECT_EQ(a.stats().allocated_bytes, held);
  EXPECT_EQ(saved.to_vector<float>(), std::vector<float>(5, 3.0f));
  EXPECT_THROW(unit.storage()->restore(a.allocate(64)), Error);
}

}  // namespace
}  // namespace cz
