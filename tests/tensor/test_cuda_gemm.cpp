// The cuBLASLt GEMM kernels against f64 references on the CPU: matmul and linear forward/backward (BIAS and
// BGRADB epilogues), each with epilogues on and off (the unfused fallback), in f32, f16 and bf16, on aligned
// and unaligned shapes; which path ran is counted and checked. Skips without a GPU. (Which epilogues cuBLASLt
// fuses, and how fast, is printed by bench/bench_gemm_cuda.)
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "common/gradcheck.h"
#include "cuda_test_util.h"
#include "tensor/autograd/engine.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/kernels.h"
#include "tensor/stream.h"

namespace cz::testing {
namespace {

struct GemmShape {
  int64_t rows, in, out;
};

// (dtype, epilogues on, shape index)
using Param = std::tuple<DType, bool, int>;
const GemmShape kShapes[] = {{37, 24, 16}, {5, 6, 3}, {130, 96, 384}, {0, 8, 8}};

class CudaGemm : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    CZ_REQUIRE_GPU();
    cuda::set_gemm_epilogues(std::get<1>(GetParam()));
  }
  void TearDown() override {
    if (cuda_available()) cuda::set_gemm_epilogues(true);
  }
  DType dtype() const { return std::get<0>(GetParam()); }
  GemmShape shape() const { return kShapes[std::get<2>(GetParam())]; }
  // A random input rounded through the tested dtype, as f64 on the host (the reference's copy).
  Tensor host_input(const Shape& s, uint64_t seed, double lo = -1, double hi = 1) const {
    return random_tensor(s, seed, DType::f64, lo, hi).to(dtype()).to(DType::f64);
  }
  Tensor dev(const Tensor& host) const { return host.to(dtype()).to(gpu()); }
  Tensor dev_empty(const Shape& s) const { return empty(s, dtype(), gpu()); }
  double rtol() const { return dtype() == DType::f32 ? 1e-5 : dtype() == DType::f16 ? 2e-3 : 1e-2; }
  double atol() const { return dtype() == DType::f32 ? 1e-4 : dtype() == DType::f16 ? 1e-2 : 5e-2; }
  Stream stream() const { return current_stream(gpu()); }
};

TEST_P(CudaGemm, MatmulMatchesReference) {
  const auto [rows, in, out] = shape();
  const Tensor a = host_input({rows, in}, 1), b = host_input({in, out}, 2);
  Tensor ref = empty({rows, out}, DType::f64);
  cpu::matmul(a, b, ref);
  Tensor y = dev_empty({rows, out});
  cuda::matmul(dev(a), dev(b), y, stream());
  EXPECT_TRUE(all_close(y, ref, rtol(), atol()));
}

TEST_P(CudaGemm, LinearForwardAndBackwardMatchReference) {
  const auto [rows, in, out] = shape();
  const Tensor x = host_input({rows, in}, 3), w = host_input({out, in}, 4), b = host_input({out}, 5),
               gy = host_input({rows, out}, 6);
  Tensor y_ref = empty({rows, out}, DType::f64), dx_ref = empty({rows, in}, DType::f64),
         dw_ref = empty({out, in}, DType::f64), db_ref = empty({out}, DType::f64);
  cpu::linear_forward(x, w, b, y_ref);
  cpu::linear_backward(gy, x, w, dx_ref, dw_ref, db_ref);

  const Tensor xg = dev(x), wg = dev(w), bg = dev(b), gyg = dev(gy);
  Tensor y = dev_empty({rows, out}), y_nobias = dev_empty({rows, out});
  cuda::linear_forward(xg, wg, bg, y, stream());
  EXPECT_TRUE(all_close(y, y_ref, rtol(), atol())) << "y";
  cuda::linear_forward(xg, wg, Tensor(), y_nobias, stream());
  Tensor y_nobias_ref = empty({rows, out}, DType::f64);
  cpu::linear_forward(x, w, Tensor(), y_nobias_ref);
  EXPECT_TRUE(all_close(y_nobias, y_nobias_ref, rtol(), atol())) << "y without bias";

  Tensor dx = dev_empty({rows, in}), dw = dev_empty({out, in}), db = dev_empty({out});
  cuda::linear_backward(gyg, xg, wg, dx, dw, db, stream());
  EXPECT_TRUE(all_close(dx, dx_ref, rtol(), atol())) << "dx";
  EXPECT_TRUE(all_close(dw, dw_ref, rtol(), atol())) << "dw";
  EXPECT_TRUE(all_close(db, db_ref, rtol(), atol())) << "db (with dw: BGRADB)";
  Tensor none, db_only = dev_empty({out});
  cuda::linear_backward(gyg, xg, wg, none, none, db_only, stream());
  EXPECT_TRUE(all_close(db_only, db_ref, rtol(), atol())) << "db alone (column sums)";
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [t, epi, s] = info.param;
  const GemmShape& sh = kShapes[s];
  return fmt::format("{}_{}_{}x{}x{}", dtype_name(t), epi ? "fused" : "unfused", sh.rows, sh.in, sh.out);
}

INSTANTIATE_TEST_SUITE_P(All, CudaGemm,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Bool(), ::testing::Range(0, 4)),
                         param_name);

// The path counters (bench_gemm_cuda reports from them): every GEMM runs once, on cuBLASLt or cublasGemmEx;
// with epilogues switched off each one that asks for an epilogue counts a fallback, with them on at most one.
TEST(CudaGemmPaths, CountersSayWhichPathRan) {
  CZ_REQUIRE_GPU();
  cuda::DeviceContext& ctx = cuda::context(gpu().index);
  cuda::GemmCounters& c = ctx.gemm_counters();
  const Stream s = current_stream(gpu());
  const int64_t rows = 64, in = 96, out = 128;
  const DType t = DType::bf16;
  const Tensor x = random_tensor({rows, in}, 1).to(t).to(gpu()),
               w = random_tensor({out, in}, 2).to(t).to(gpu()), b = random_tensor({out}, 3).to(t).to(gpu()),
               gy = random_tensor({rows, out}, 4).to(t).to(gpu());
  Tensor y = empty({rows, out}, t, gpu()), dw = empty({out, in}, t, gpu()), db = empty({out}, t, gpu()), none;
  for (const bool fused : {true, false}) {
    ctx.set_gemm_epilogues(fused);
    const int64_t lt = c.lt, fallbacks = c.epilogue_fallbacks, ex = c.gemm_ex;
    cuda::linear_forward(x, w, b, y, s);               // BIAS
    cuda::linear_backward(gy, x, w, none, dw, db, s);  // BGRADB
    EXPECT_EQ(c.lt - lt + c.gemm_ex - ex, 2) << "epilogues " << fused << ": one GEMM per call";
    if (fused)
      EXPECT_LE(c.epilogue_fallbacks - fallbacks, 2);
    else
      EXPECT_EQ(c.epilogue_fallbacks - fallbacks, 2) << "epilogues off: both calls fall back";
  }
  ctx.set_gemm_epilogues(true);
  s.synchronize();
}

TEST(CudaGemmF64, MatmulAndLinearMatchCpu) {
  CZ_REQUIRE_GPU();
  const Tensor a = random_tensor({33, 17}, 1), b = random_tensor({17, 9}, 2), bias = random_tensor({9}, 3);
  Tensor ref = empty({33, 9}, DType::f64), y = empty({33, 9}, DType::f64, gpu());
  cpu::matmul(a, b, ref);
  cuda::matmul(a.to(gpu()), b.to(gpu()), y, current_stream(gpu()));
  EXPECT_TRUE(all_close(y, ref, 1e-12, 1e-12));
  const Tensor w = b.transpose(0, 1).contiguous();
  cpu::linear_forward(a, w, bias, ref);
  cuda::linear_forward(a.to(gpu()), w.to(gpu()), bias.to(gpu()), y, current_stream(gpu()));
  EXPECT_TRUE(all_close(y, ref, 1e-12, 1e-12));
}

TEST(CudaGemmF64, LinearBackwardMatchesCpu) {
  CZ_REQUIRE_GPU();
  const int64_t rows = 33, in = 17, out = 9;
  const Tensor x = random_tensor({rows, in}, 6), w = random_tensor({out, in}, 7),
               gy = random_tensor({rows, out}, 8);
  Tensor dx_ref = empty({rows, in}, DType::f64), dw_ref = empty({out, in}, DType::f64),
         db_ref = empty({out}, DType::f64);
  cpu::linear_backward(gy, x, w, dx_ref, dw_ref, db_ref);
  Tensor dx = empty({rows, in}, DType::f64, gpu()), dw = empty({out, in}, DType::f64, gpu()),
         db = empty({out}, DType::f64, gpu());
  cuda::linear_backward(gy.to(gpu()), x.to(gpu()), w.to(gpu()), dx, dw, db, current_stream(gpu()));
  EXPECT_TRUE(all_close(dx, dx_ref, 1e-12, 1e-12)) << "dx";
  EXPECT_TRUE(all_close(dw, dw_ref, 1e-12, 1e-12)) << "dw";
  EXPECT_TRUE(all_close(db, db_ref, 1e-12, 1e-12)) << "db";
}

// A contiguous view `offset` elements into a zeroed GPU buffer of dtype t, holding `host` (rounded to t) if
// given. With offset 1 the pointers are only element-aligned, as views into flat buffers may be.
Tensor offset_view(const Shape& shape, DType t, int64_t offset, const Tensor& host = Tensor()) {
  const int64_t n = shape_numel(shape);
  Tensor v = zeros({n + offset}, t, gpu()).narrow(0, offset, n).view(shape);
  if (host.defined()) v.copy_(host);
  return v;
}

// The cuBLASLt algorithm cache is keyed by the operands' alignment: an algorithm chosen for 256-byte aligned
// operands must not be reused for the same shapes at 2- or 4-byte alignment (the aligned run comes first, so
// its choice is cached when the offset run asks).
TEST(CudaGemmAlignment, ElementAlignedOperandsAfterAlignedOnes) {
  CZ_REQUIRE_GPU();
  const int64_t rows = 64, in = 32, out = 48;
  const Stream s = current_stream(gpu());
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    auto rounded = [&](const Shape& shape, uint64_t seed) {
      return random_tensor(shape, seed).to(t).to(DType::f64);
    };
    const Tensor x = rounded({rows, in}, 21), w = rounded({out, in}, 22), b = rounded({out}, 23),
                 gy = rounded({rows, out}, 24);
    Tensor y_ref = empty({rows, out}, DType::f64), dx_ref = empty({rows, in}, DType::f64),
           dw_ref = empty({out, in}, DType::f64), db_ref = empty({out}, DType::f64);
    cpu::linear_forward(x, w, b, y_ref);
    cpu::linear_backward(gy, x, w, dx_ref, dw_ref, db_ref);
    const double rtol = t == DType::f32   ? 1e-5
                        : t == DType::f16 ? 2e-3
                                          : 1e-2,
                 atol = t == DType::f32   ? 1e-4
                        : t == DType::f16 ? 1e-2
                                          : 5e-2;
    for (int64_t offset : {0, 1}) {
      const Tensor xg = offset_view({rows, in}, t, offset, x), wg = offset_view({out, in}, t, offset, w),
                   bg = offset_view({out}, t, offset, b), gyg = offset_view({rows, out}, t, offset, gy);
      Tensor y = offset_view({rows, out}, t, offset), dx = offset_view({rows, in}, t, offset),
             dw = offset_view({out, in}, t, offset), db = offset_view({out}, t, offset);
      cuda::linear_forward(xg, wg, bg, y, s);
      cuda::linear_backward(gyg, xg, wg, dx, dw, db, s);
      const std::string what = fmt::format("{} offset {}", dtype_name(t), offset);
      EXPECT_TRUE(all_close(y, y_ref, rtol, atol)) << what << ": y";
      EXPECT_TRUE(all_close(dx, dx_ref, rtol, atol)) << what << ": dx";
      EXPECT_TRUE(all_close(dw, dw_ref, rtol, atol)) << what << ": dw";
      EXPECT_TRUE(all_close(db, db_ref, rtol, atol)) << what << ": db";
    }
  }
}

// A ConvNeXt-T stage-1 pointwise layer over one 56 x 56 image: the weight gradient's inner size is 3136 rows,
// where cuBLASLt may split K (and reduce the BGRADB bias gradient across the splits). The absolute tolerance
// grows with the sums' typical size (sqrt(K) / 3 for products of U(-1, 1) values), in case the split partials
// are added in the output dtype.
TEST(CudaGemmConvNextShapes, PointwiseLayerForwardAndBackward) {
  CZ_REQUIRE_GPU();
  const int64_t rows = 3136, in = 96, out = 384;
  const Stream s = current_stream(gpu());
  for (DType t : {DType::f32, DType::bf16}) {
    auto rounded = [&](const Shape& shape, uint64_t seed) {
      return random_tensor(shape, seed).to(t).to(DType::f64);
    };
    const Tensor x = rounded({rows, in}, 31), w = rounded({out, in}, 32), b = rounded({out}, 33),
                 gy = rounded({rows, out}, 34);
    Tensor y_ref = empty({rows, out}, DType::f64), dx_ref = empty({rows, in}, DType::f64),
           dw_ref = empty({out, in}, DType::f64), db_ref = empty({out}, DType::f64);
    cpu::linear_forward(x, w, b, y_ref);
    cpu::linear_backward(gy, x, w, dx_ref, dw_ref, db_ref);
    const Tensor xg = x.to(t).to(gpu()), wg = w.to(t).to(gpu()), bg = b.to(t).to(gpu()),
                 gyg = gy.to(t).to(gpu());
    Tensor y = empty({rows, out}, t, gpu()), dx = empty({rows, in}, t, gpu()),
           dw = empty({out, in}, t, gpu()), db = empty({out}, t, gpu());
    cuda::linear_forward(xg, wg, bg, y, s);
    cuda::linear_backward(gyg, xg, wg, dx, dw, db, s);
    const double rtol = t == DType::f32 ? 1e-5 : 1e-2, unit = t == DType::f32 ? 1e-4 : 1e-2;
    auto atol = [&](int64_t k) { return unit * std::sqrt(double(k)) / 3; };
    EXPECT_TRUE(all_close(y, y_ref, rtol, atol(in))) << dtype_name(t) << ": y";
    EXPECT_TRUE(all_close(dx, dx_ref, rtol, atol(out))) << dtype_name(t) << ": dx";
    EXPECT_TRUE(all_close(dw, dw_ref, rtol, atol(rows))) << dtype_name(t) << ": dw";
    EXPECT_TRUE(all_close(db, db_ref, rtol, atol(rows))) << dtype_name(t) << ": db";
  }
}

TEST(CudaGemmTf32, SwitchChangesNothingButPrecision) {
  CZ_REQUIRE_GPU();
  cuda::DeviceContext& ctx = cuda::context(gpu().index);
  EXPECT_FALSE(ctx.allow_tf32()) << "TF32 must be off by default";
  const Tensor a = random_tensor({64, 256}, 4).to(DType::f32), b = random_tensor({256, 48}, 5).to(DType::f32);
  Tensor ref = empty({64, 48}, DType::f32), y = empty({64, 48}, DType::f32, gpu());
  cpu::matmul(a, b, ref);
  ctx.set_allow_tf32(true);
  cuda::matmul(a.to(gpu()), b.to(gpu()), y, current_stream(gpu()));
  ctx.set_allow_tf32(false);
  EXPECT_TRUE(all_close(y, ref, 1e-2, 1e-2)) << "TF32 result";
  cuda::matmul(a.to(gpu()), b.to(gpu()), y, current_stream(gpu()));
  EXPECT_TRUE(all_close(y, ref, 1e-5, 1e-4)) << "f32 result after switching TF32 off";
}

}  // namespace
}  // namespace cz::testing
