// The GRN kernels without a GPU: their per-thread work and reduction order run on the CPU (grn_emulation.h)
// against the CPU backend, in f32, bf16 and f16, at shapes around a block's 32-channel tile, its 8 pixel
// lanes and step 2's 4 images per block, with an all-zero channel (the gradient's gx = 0 branch).
#include <gtest/gtest.h>

#include "common/gradcheck.h"
#include "emulation_testing.h"
#include "grn_emulation.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace cz::testing {
namespace {

struct Size {
  int64_t n, h, w, c;
};
const std::vector<Size> kSizes = {{1, 1, 1, 1}, {2, 3, 5, 19}, {3, 7, 7, 40}, {5, 9, 9, 33}, {2, 2, 2, 70}};

template <class T>
Tensor f32_of(const std::vector<T>& v, const Shape& shape) {
  std::vector<float> f;
  for (const T& x : v) f.push_back(float(x));
  return from_vector(f, shape);
}

// The emulated kernels in dtype T against the CPU backend in f32 from the same T-rounded inputs.
template <class T>
void check(DType dtype, double tol) {
  for (const Size& s : kSizes) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << shape_str({s.n, s.h, s.w, s.c}));
    const Shape shape{s.n, s.h, s.w, s.c};
    const int64_t hw = s.h * s.w;
    std::vector<double> xd = random_tensor(shape, uint64_t(s.c), DType::f64, -2, 2).to_vector<double>();
    for (int64_t p = 0; p < hw; ++p) xd[size_t(p * s.c)] = 0;  // image 0, channel 0
    const std::vector<T> x = cast<T>(xd),
                         g = cast<T>(random_tensor(shape, uint64_t(s.c + 1), DType::f64).to_vector<double>()),
                         gamma = cast<T>(random_tensor({s.c}, 3, DType::f64).to_vector<double>()),
                         beta = cast<T>(random_tensor({s.c}, 4, DType::f64).to_vector<double>());
    const auto emu = emulate_grn<T>(x, g, gamma, beta, s.n, hw, s.c, 1e-6);

    Tensor xc = f32_of(x, shape).set_requires_grad(true), gc = f32_of(gamma, {s.c}).set_requires_grad(true),
           bc = f32_of(beta, {s.c}).set_requires_grad(true);
    const Tensor y = grn(xc, gc, bc);
    y.backward(f32_of(g, shape));
    EXPECT_TRUE(all_close(f32_of(emu.y, shape), y, tol, tol));
    EXPECT_TRUE(all_close(f32_of(emu.dx, shape), xc.grad(), tol, tol));
    EXPECT_TRUE(all_close(f32_of(emu.dgamma, {s.c}), gc.grad(), tol, tol));
    EXPECT_TRUE(all_close(f32_of(emu.dbeta, {s.c}), bc.grad(), tol, tol));
  }
}

EMULATION_TESTS_EACH_DTYPE(GrnEmulation)

}  // namespace
}  // namespace cz::testing
