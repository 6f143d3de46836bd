// The soft-target cross-entropy kernels without a GPU: their per-thread work and reduction order run on the
// CPU (soft_target_emulation.h) against the CPU backend, in f32, bf16 and f16, at shapes below, at and above
// one block's 256 threads per row and 256 rows for the mean.
#include <gtest/gtest.h>

#include <cmath>

#include "common/gradcheck.h"
#include "emulation_testing.h"
#include "soft_target_emulation.h"
#include "tensor/ops.h"

namespace cz::testing {
namespace {

struct Size {
  int64_t n, k;
};
const std::vector<Size> kSizes = {{1, 1}, {3, 7}, {2, 255}, {4, 257}, {2, 1000}, {300, 5}, {513, 10}};

// Soft rows: positive, each summing to about 1, with a few larger entries, as Mixup's targets.
std::vector<double> soft_rows(int64_t n, int64_t k, uint64_t seed) {
  std::vector<double> t = random_tensor({n, k}, seed, DType::f64, 0, 1).to_vector<double>();
  for (int64_t r = 0; r < n; ++r) {
    double s = 0;
    for (int64_t c = 0; c < k; ++c) s += t[size_t(r * k + c)] * t[size_t(r * k + c)];
    for (int64_t c = 0; c < k; ++c) t[size_t(r * k + c)] = t[size_t(r * k + c)] * t[size_t(r * k + c)] / s;
  }
  return t;
}

// The emulated kernels in dtype T against the CPU backend in f32 from the same T-rounded inputs.
template <class T>
void check(DType dtype, double tol) {
  for (const Size& s : kSizes) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << s.n << "x" << s.k);
    const std::vector<double> zd =
        random_tensor({s.n, s.k}, uint64_t(s.n * 1000 + s.k), DType::f64, -6, 6).to_vector<double>();
    const std::vector<T> z = cast<T>(zd), t = cast<T>(soft_rows(s.n, s.k, uint64_t(s.k)));
    const T g = T(0.75f);
    const auto emu = emulate_soft_target_cross_entropy<T>(z, t, s.n, s.k, g);

    std::vector<float> zf, tf;
    for (size_t i = 0; i < z.size(); ++i) {
      zf.push_back(float(z[i]));
      tf.push_back(float(t[i]));
    }
    Tensor zc = from_vector(zf, {s.n, s.k}).set_requires_grad(true);
    Tensor tc = from_vector(tf, {s.n, s.k}).set_requires_grad(true);
    const Tensor loss = soft_target_cross_entropy(zc, tc);
    loss.backward(full({}, 0.75, DType::f32));
    EXPECT_NEAR(float(emu.loss), loss.item(), tol * (1 + std::abs(loss.item())));
    std::vector<float> dz, dt;
    for (size_t i = 0; i < z.size(); ++i) {
      dz.push_back(float(emu.dlogits[i]));
      dt.push_back(float(emu.dtargets[i]));
    }
    EXPECT_TRUE(all_close(from_vector(dz, {s.n, s.k}), zc.grad(), tol, tol * 1e-2));
    EXPECT_TRUE(all_close(from_vector(dt, {s.n, s.k}), tc.grad(), tol, tol * 1e-2));
  }
}

EMULATION_TESTS_EACH_DTYPE(SoftTargetEmulation)

// Every thread's value reaches the block's result, whichever warp holds it; threads past a row's end add
// nothing to its maximum.
TEST(SoftTargetEmulation, BlockReductionSeesEveryThread) {
  for (size_t hot = 0; hot < size_t(cuda::stce::kRowThreads); hot += 37) {
    std::vector<float> v(cuda::stce::kRowThreads, 1.f);
    v[hot] = 1000.f;
    EXPECT_EQ(emulate_block_reduce(v, [](float a, float b) { return a + b; }), 1255.f) << hot;
    EXPECT_EQ(emulate_block_reduce(v, [](float a, float b) { return a > b ? a : b; }), 1000.f) << hot;
  }
  const float row[3] = {-5.f, 2.f, 1.f};
  EXPECT_EQ((cuda::stce::thread_max<float, float, HostElemCvt>(row, 3, 1)), 2.f);
  EXPECT_EQ((cuda::stce::thread_max<float, float, HostElemCvt>(row, 3, 5)), -INFINITY);
}

}  // namespace
}  // namespace cz::testing
