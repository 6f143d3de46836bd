// The cuBLASLt GEMM kernels against f64 references on the CPU: matmul, linear forward/backward (BIAS and
// BGRADB epilogues), the fused linear + tanh-GELU kernels (GELU_AUX, DGELU, DGELU_BGRAD), each with epilogues
// on and off (the unfused fallback), in f32, f16 and bf16, on aligned and unaligned shapes; which path ran is
// counted and checked. Skips without a GPU. (Which epilogues cuBLASLt fuses, and how fast, is printed by
// bench/bench_gemm_cuda.)
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
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

double gelu_tanh(double v) {
  return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}
double gelu_tanh_grad(double v) {
  const double k0 = 0.7978845608028654, k1 = 0.044715, t = std::tanh(k0 * (v + k1 * v * v * v));
  return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k0 * (1 + 3 * k1 * v * v);
}
double gelu_erf(double v) {
  return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
}

Tensor map(const Tensor& t, double (*f)(double)) {
  auto v = t.to_vector<double>();
  for (double& x : v) x = f(x);
  return from_vector(v, t.sizes());
}
Tensor mul_host(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) x[i] *= y[i];
  return from_vector(x, a.sizes());
}

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

TEST_P(CudaGemm, LinearGeluForwardIsTheTanhForm) {
  const auto [rows, in, out] = shape();
  // Wide inputs so pre-activations reach |v| ~ 2.7, where tanh and erf GELU differ most (4.7e-4).
  const Tensor x = host_input({rows, in}, 7, -1.5, 1.5), w = host_input({out, in}, 8, -0.5, 0.5),
               b = host_input({out}, 9, -2, 2);
  Tensor pre_ref = empty({rows, out}, DType::f64);
  cpu::linear_forward(x, w, b, pre_ref);
  Tensor pre = dev_empty({rows, out}), y = dev_empty({rows, out});
  cuda::linear_gelu_forward(dev(x), dev(w), dev(b), y, pre, stream());
  EXPECT_TRUE(all_close(pre, pre_ref, rtol(), atol())) << "pre";
  // y from the kernel's own pre (rounded to the dtype), against both GELU forms.
  const Tensor pre_h = pre.to(DType::f64).cpu();
  const double tol = dtype() == DType::f32 ? 2e-3 : atol();
  EXPECT_TRUE(all_close(y, map(pre_h, gelu_tanh), tol, tol)) << "y vs tanh GELU";
  if (dtype() == DType::f32 && rows > 0) {
    // Report how close the result is to each form: the GPU check reads these lines.
    auto dev_of = [&](double (*f)(double)) {
      const auto a = y.to_vector<double>(), e = map(pre_h, f).to_vector<double>();
      double m = 0;
      for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - e[i]));
      return m;
    };
    std::cout << "[linear_gelu_forward f32 epilogues=" << cuda::gemm_epilogues() << " shape " << rows << "x"
              << in << "x" << out << "] max |y - gelu_tanh| = " << dev_of(gelu_tanh)
              << ", max |y - gelu_erf| = " << dev_of(gelu_erf) << "\n";
  }
  // Without a bias.
  Tensor pre2 = dev_empty({rows, out}), y2 = dev_empty({rows, out}),
         pre2_ref = empty({rows, out}, DType::f64);
  cuda::linear_gelu_forward(dev(x), dev(w), Tensor(), y2, pre2, stream());
  cpu::linear_forward(x, w, Tensor(), pre2_ref);
  EXPECT_TRUE(all_close(pre2, pre2_ref, rtol(), atol())) << "pre without bias";
  EXPECT_TRUE(all_close(y2, map(pre2.to(DType::f64).cpu(), gelu_tanh), tol, tol)) << "y without bias";
}

TEST_P(CudaGemm, LinearGeluBackwardMatchesReference) {
  const auto [rows, in, out] = shape();
  const Tensor x = host_input({rows, in}, 10), w = host_input({out, in}, 11),
               pre = host_input({rows, out}, 12, -3, 3), gy = host_input({rows, out}, 13);
  const Tensor dpre = mul_host(gy, map(pre, gelu_tanh_grad));
  Tensor dx_ref = empty({rows, in}, DType::f64), dw_ref = empty({out, in}, DType::f64),
         db_ref = empty({out}, DType::f64);
  cpu::linear_backward(dpre, x, w, dx_ref, dw_ref, db_ref);
  Tensor dx = dev_empty({rows, in}), dw = dev_empty({out, in}), db = dev_empty({out});
  cuda::linear_gelu_backward(dev(gy), dev(x), dev(w), dev(pre), dx, dw, db, stream());
  // dpre is rounded to the dtype before the GEMMs: a little looser for 16-bit types.
  const double k = dtype() == DType::f32 ? 1 : 2;
  EXPECT_TRUE(all_close(dx, dx_ref, k * rtol(), k * atol())) << "dx";
  EXPECT_TRUE(all_close(dw, dw_ref, k * rtol(), k * atol())) << "dw";
  EXPECT_TRUE(all_close(db, db_ref, k * rtol(), k * atol())) << "db";
}

TEST_P(CudaGemm, LinearBackwardThroughGeluMatchesReference) {
  const auto [rows, in, out] = shape();
  const Tensor gy = host_input({rows, out}, 14), w = host_input({out, in}, 15),
               pre = host_input({rows, in}, 16, -3, 3);
  Tensor gx = empty({rows, in}, DType::f64);
  cpu::matmul(gy, w, gx);
  const Tensor dpre_ref = mul_host(gx, map(pre, gelu_tanh_grad));
  std::vector<double> colsum(size_t(in), 0.0);
  const auto dv = dpre_ref.to_vector<double>();
  for (size_t i = 0; i < dv.size(); ++i) colsum[i % size_t(in)] += dv[i];
  const Tensor dbias_ref = from_vector(colsum, {in});
  Tensor none;
  Tensor dpre = dev_empty({rows, in}), dbias = dev_empty({in});
  cuda::linear_backward_dgelu(dev(gy), dev(w), dev(pre), dpre, dbias, stream());
  const double tol = dtype() == DType::f32 ? 2e-3 : 2 * atol();
  EXPECT_TRUE(all_close(dpre, dpre_ref, tol, tol)) << "dpre";
  EXPECT_TRUE(all_close(dbias, dbias_ref, tol, tol * std::sqrt(double(std::max<int64_t>(rows, 1)))))
      << "dbias (DGELU_BGRAD)";
  Tensor dpre2 = dev_empty({rows, in});
  cuda::linear_backward_dgelu(dev(gy), dev(w), dev(pre), dpre2, none, stream());
  EXPECT_TRUE(all_close(dpre2, dpre_ref, tol, tol)) << "dpre without dbias";
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
  cuda::GemmCounters& c = cuda::context(gpu().index).gemm_counters();
  const Stream s = current_stream(gpu());
  const int64_t rows = 64, in = 96, out = 128;
  const DType t = DType::bf16;
  const Tensor x = random_tensor({rows, in}, 1).to(t).to(gpu()),
               w = random_tensor({out, in}, 2).to(t).to(gpu()), b = random_tensor({out}, 3).to(t).to(gpu()),
               gy = random_tensor({rows, out}, 4).to(t).to(gpu());
  Tensor y = empty({rows, out}, t, gpu()), dw = empty({out, in}, t, gpu()), db = empty({out}, t, gpu()), none;
  for (const bool fused : {true, false}) {
    cuda::set_gemm_epilogues(fused);
    const int64_t lt = c.lt, fallbacks = c.epilogue_fallbacks, ex = c.gemm_ex;
    cuda::linear_forward(x, w, b, y, s);               // BIAS
    cuda::linear_backward(gy, x, w, none, dw, db, s);  // BGRADB
    EXPECT_EQ(c.lt - lt + c.gemm_ex - ex, 2) << "epilogues " << fused << ": one GEMM per call";
    if (fused)
      EXPECT_LE(c.epilogue_fallbacks - fallbacks, 2);
    else
      EXPECT_EQ(c.epilogue_fallbacks - fallbacks, 2) << "epilogues off: both calls fall back";
  }
  cuda::set_gemm_epilogues(true);
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
  EXPECT_FALSE(cuda::allow_tf32()) << "TF32 must be off by default";
  const Tensor a = random_tensor({64, 256}, 4).to(DType::f32), b = random_tensor({256, 48}, 5).to(DType::f32);
  Tensor ref = empty({64, 48}, DType::f32), y = empty({64, 48}, DType::f32, gpu());
  cpu::matmul(a, b, ref);
  cuda::set_allow_tf32(true);
  cuda::matmul(a.to(gpu()), b.to(gpu()), y, current_stream(gpu()));
  cuda::set_allow_tf32(false);
  EXPECT_TRUE(all_close(y, ref, 1e-2, 1e-2)) << "TF32 result";
  cuda::matmul(a.to(gpu()), b.to(gpu()), y, current_stream(gpu()));
  EXPECT_TRUE(all_close(y, ref, 1e-5, 1e-4)) << "f32 result after switching TF32 off";
}

}  // namespace
}  // namespace cz::testing
