// Views share storage and follow strides; contiguous() and reshape copy only when they must.
#include <gtest/gtest.h>
#include <omp.h>

#include <numeric>

#include "common/gradcheck.h"
#include "tensor/parallel.h"
#include "tensor/tensor.h"

namespace cz {
namespace {

Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return from_vector(v, shape);
}

TEST(Views, PermuteSharesStorageAndContiguousReorders) {
  Tensor x = iota({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});  // (4, 2, 3)
  EXPECT_EQ(p.sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(p.storage(), x.storage());
  EXPECT_FALSE(p.is_contiguous());
  Tensor c = p.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), x.storage());
  const auto v = c.to_vector<float>();
  // c[k][i][j] == x[i][j][k] == 12 i + 4 j + k
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(v[size_t(k * 6 + i * 3 + j)], float(12 * i + 4 * j + k));
}

TEST(Views, NarrowAndSelectOffsetIntoStorage) {
  Tensor x = iota({4, 5});
  Tensor n = x.narrow(1, 1, 3);
  EXPECT_EQ(n.offset(), 1);
  EXPECT_EQ(n.contiguous().to_vector<float>(),
            (std::vector<float>{1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18}));
  Tensor row = x.select(0, 2);
  EXPECT_EQ(row.sizes(), (Shape{5}));
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{10, 11, 12, 13, 14}));
  EXPECT_EQ(x.select(1, -1).to_vector<float>(), (std::vector<float>{4, 9, 14, 19}));
  EXPECT_THROW(x.narrow(1, 3, 3), ShapeError);
}

TEST(Views, ViewRefusesIncompatibleStridesReshapeCopies) {
  Tensor x = iota({2, 3, 4});
  Tensor v = x.view({6, -1});
  EXPECT_EQ(v.sizes(), (Shape{6, 4}));
  EXPECT_EQ(v.storage(), x.storage());
  Tensor t = x.transpose(0, 2);  // (4, 3, 2), not contiguous
  EXPECT_THROW(t.view({12, 2}), ShapeError);
  Tensor r = t.reshape({12, 2});
  EXPECT_NE(r.storage(), x.storage());
  EXPECT_EQ(r.to_vector<float>(), t.contiguous().to_vector<float>());
  // A permuted view whose merged dims stay contiguous still views without copying.
  Tensor nhwc = iota({2, 3, 4, 5});
  Tensor merged = nhwc.narrow(0, 1, 1).view({12, 5});
  EXPECT_EQ(merged.storage(), nhwc.storage());
  EXPECT_EQ(merged.to_vector<float>()[0], 60.0f);
  EXPECT_THROW(x.view({5, -1}), ShapeError);
  EXPECT_THROW(x.view({-1, -1}), ShapeError);
}

TEST(Views, CopyIntoStridedDestinationConvertsDtype) {
  Tensor x = zeros({3, 4}, DType::f64);
  Tensor col = x.narrow(1, 2, 1);
  col.copy_(from_vector<float>({1.5f, 2.5f, 3.5f}, {3, 1}));
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{0, 0, 1.5, 0, 0, 0, 2.5, 0, 0, 0, 3.5, 0}));
  EXPECT_THROW(col.copy_(zeros({3})), ShapeError);
}

// Long rows are cut into pieces across the threads (for_each_row in src/tensor/cpu/basic.cpp): a contiguous
// tensor is one row, a narrowed one a few long rows. Every element of fill, copy, add_ and mul_ lands once,
// with 3 threads cutting uneven pieces.
TEST(Views, LongRowsAreSplitAcrossThreadsAndCoverEveryElement) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(3);
  const int64_t n = 3 * kParallelGrain + 7;
  Tensor flat = iota({n});
  Tensor wide = iota({3, n});
  Tensor rows = wide.narrow(1, 5, n - 9);  // 3 strided rows of n - 9
  Tensor y = zeros({n});
  y.copy_(flat).add_(flat, 2.0).mul_(0.5);
  std::vector<float> got = y.to_vector<float>();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], 1.5f * float(i)) << i;
  Tensor r = zeros({3, n - 9}, DType::f64);
  r.copy_(rows);
  rows.fill_(-1.0);
  const std::vector<double> copied = r.to_vector<double>();
  const std::vector<float> filled = wide.to_vector<float>();
  for (int64_t row = 0; row < 3; ++row) {
    for (int64_t j = 0; j < n; ++j) {
      const bool inside = j >= 5 && j < n - 4;
      ASSERT_EQ(filled[size_t(row * n + j)], inside ? -1.0f : float(row * n + j)) << row << " " << j;
      if (inside) ASSERT_EQ(copied[size_t(row * (n - 9) + j - 5)], double(row * n + j)) << row << " " << j;
    }
  }
  omp_set_num_threads(threads);
}

TEST(Views, GradientsFlowBackThroughViews) {
  Tensor x = testing::random_tensor({2, 3, 4}, 1);
  auto fn = [](const std::vector<Tensor>& in) {
    return in[0].permute({2, 0, 1}).narrow(0, 1, 2).reshape({2, 6}).select(1, 3).contiguous();
  };
  x.set_requires_grad(true);
  EXPECT_TRUE(testing::gradcheck(fn, {x}));
}

TEST(Views, ErrorsNameTheOpAndShapes) {
  Tensor x = zeros({2, 3});
  try {
    x.view({4, 2});
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("(2, 3)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("view"), std::string::npos) << e.what();
  }
  EXPECT_THROW(x.permute({0, 0}), ShapeError);
  EXPECT_THROW(x.size(2), ShapeError);
}

}  // namespace
}  // namespace cz
