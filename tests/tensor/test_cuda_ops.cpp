// The ConvNeXt op kernels on CUDA beyond the op table: argmax with ties and NaN, device-side label checks,
// ConvNeXt-sized shapes, bit-for-bit repeatability of the deterministic reductions, the cuDNN algorithm
// cache in both search modes, and the three depthwise paths (tiled, cuDNN, direct), the tiled kernels against
// their CPU emulation bit for bit, the soft-target and GRN kernels against theirs. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "common/gradcheck.h"
#include "cuda_test_util.h"
#include "depthwise_emulation.h"
#include "grn_emulation.h"
#include "soft_target_emulation.h"
#include "tensor/autograd/engine.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace cz::testing {
namespace {

Tensor r32(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1) {
  return random_tensor(shape, seed, DType::f32, lo, hi);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.to(DType::f64).to_vector<double>() == b.to(DType::f64).to_vector<double>();
}

TEST(CudaOps, ArgmaxMatchesCpuWithTiesAndNaN) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Rows: a tie (first index wins), a NaN after the maximum, a NaN first, all equal, a wide row past 32
  // lanes.
  std::vector<double> v = {1, 3, 3, 0, 2, 5, nan, 1, nan, 9, 9, 9, 4, 4, 4, 4};
  Tensor small = from_vector(v, {4, 4});
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor expect = argmax(small);
    EXPECT_EQ(argmax(small.to(t).to(gpu())).to_vector<int64_t>(), expect.to_vector<int64_t>())
        << dtype_name(t);
  }
  Tensor wide = r32({37, 1000}, 3);
  EXPECT_EQ(argmax(wide.to(gpu())).to_vector<int64_t>(), argmax(wide).to_vector<int64_t>());
}

TEST(CudaOps, CrossEntropyWithAnOutOfRangeDeviceLabelIsNaN) {
  CZ_REQUIRE_GPU();
  const Tensor logits = r32({3, 5}, 4).to(gpu());
  const Tensor labels = from_vector(std::vector<int64_t>{1, 7, 0}, {3}).to(gpu());
  EXPECT_TRUE(std::isnan(cross_entropy(logits, labels, 0.1).item()));
}

// Forward and input gradients of f at ConvNeXt-T shapes (smaller batch) against the CPU in f32, and twice on
// the GPU, expecting the same bits.
void check_large(const char* name, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                 const std::vector<Tensor>& host_inputs, double tol) {
  auto run = [&](Device d) {
    std::vector<Tensor> in;
    for (const Tensor& t : host_inputs) in.push_back(t.to(d).detach().set_requires_grad(true));
    Tensor out = f(in);
    const Tensor w = r32(out.sizes(), 99).to(d);
    sum(mul(out, w)).backward();
    std::vector<Tensor> r{out.detach()};
    for (const Tensor& t : in) r.push_back(t.grad());
    return r;
  };
  const auto cpu_r = run(Device::cpu()), gpu_a = run(gpu()), gpu_b = run(gpu());
  for (size_t i = 0; i < cpu_r.size(); ++i) {
    EXPECT_TRUE(all_close(gpu_a[i], cpu_r[i], tol, tol)) << name << " result " << i;
    EXPECT_TRUE(same_bits(gpu_a[i], gpu_b[i])) << name << " result " << i << " differs between two runs";
  }
}

TEST(CudaOps, ConvNeXtShapesMatchCpuAndRepeatBitForBit) {
  CZ_REQUIRE_GPU();
  check_large(
      "layer_norm", [](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-6); },
      {r32({2, 28, 28, 192}, 1), r32({192}, 2), r32({192}, 3)}, 1e-4);
  check_large(
      "depthwise_7x7", [](const auto& in) { return depthwise_conv2d(in[0], in[1], in[2]); },
      {r32({2, 14, 14, 384}, 4), r32({384, 1, 7, 7}, 5), r32({384}, 6)}, 1e-4);
  check_large(
      "stem_4x4", [](const auto& in) { return patchify_conv2d(in[0], in[1], in[2]); },
      {r32({2, 64, 64, 3}, 7), r32({96, 3, 4, 4}, 8), r32({96}, 9)}, 1e-4);
  check_large(
      "downsample_2x2", [](const auto& in) { return patchify_conv2d(in[0], in[1], in[2]); },
      {r32({2, 14, 14, 192}, 10), r32({384, 192, 2, 2}, 11), r32({384}, 12)}, 1e-4);
  check_large(
      "gelu", [](const auto& in) { return gelu(in[0]); }, {r32({2, 7, 7, 3072}, 13)}, 1e-5);
  check_large(
      "pool", [](const auto& in) { return global_avg_pool(in[0]); }, {r32({4, 7, 7, 768}, 14)}, 1e-5);
  check_large(
      "grn", [](const auto& in) { return grn(in[0], in[1], in[2]); },
      {r32({2, 28, 28, 768}, 18), r32({768}, 19), r32({768}, 20)}, 1e-4);
  Generator gen(5);
  const Tensor labels = randint(1000, {16}, gen);
  check_large(
      "cross_entropy", [&](const auto& in) { return cross_entropy(in[0], labels.to(in[0].device()), 0.1); },
      {r32({16, 1000}, 15, -4, 4)}, 1e-5);
  check_large(
      "soft_target_cross_entropy", [](const auto& in) { return soft_target_cross_entropy(in[0], in[1]); },
      {r32({16, 1000}, 16, -4, 4), r32({16, 1000}, 17, 0, 0.002)}, 1e-5);
}

// The soft-target kernels against their CPU emulation (soft_target_emulation.h): the same per-thread work
// and reduction order, so only the device's exp/log and multiply-add contraction differ (a few ulps).
TEST(CudaOps, SoftTargetCrossEntropyMatchesItsEmulation) {
  CZ_REQUIRE_GPU();
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{3, 7}, {4, 257}, {300, 5}, {16, 1000}}) {
    const Tensor z = r32({n, k}, uint64_t(n + k), -6, 6),
                 t = r32({n, k}, uint64_t(n * k), 0, 2.0 / double(k));
    const auto emu =
        emulate_soft_target_cross_entropy<float>(z.to_vector<float>(), t.to_vector<float>(), n, k, 0.75f);
    Tensor zg = z.to(gpu()).set_requires_grad(true), tg = t.to(gpu()).set_requires_grad(true);
    const Tensor loss = soft_target_cross_entropy(zg, tg);
    loss.backward(full({}, 0.75, DType::f32, gpu()));
    EXPECT_NEAR(loss.item(), double(emu.loss), 4e-7 * (1 + std::abs(double(emu.loss)))) << n << "x" << k;
    EXPECT_TRUE(all_close(zg.grad().cpu(), from_vector(emu.dlogits, {n, k}), 1e-6, 1e-9)) << n << "x" << k;
    EXPECT_TRUE(all_close(tg.grad().cpu(), from_vector(emu.dtargets, {n, k}), 1e-6, 1e-9)) << n << "x" << k;
  }
}

// The GRN kernels against their CPU emulation (grn_emulation.h): the same per-thread work and reduction
// order, so only the device's sqrt and multiply-add contraction differ (a few ulps).
TEST(CudaOps, GrnMatchesItsEmulation) {
  CZ_REQUIRE_GPU();
  for (const Shape& shape : std::vector<Shape>{{2, 3, 5, 19}, {5, 9, 9, 33}, {3, 14, 14, 384}}) {
    const int64_t n = shape[0], hw = shape[1] * shape[2], c = shape[3];
    const Tensor x = r32(shape, uint64_t(c), -2, 2), g = r32(shape, uint64_t(c + 1));
    const Tensor gamma = r32({c}, 3), beta = r32({c}, 4);
    const auto emu = emulate_grn<float>(x.to_vector<float>(), g.to_vector<float>(), gamma.to_vector<float>(),
                                        beta.to_vector<float>(), n, hw, c, 1e-6);
    Tensor xg = x.to(gpu()).set_requires_grad(true), gg = gamma.to(gpu()).set_requires_grad(true),
           bg = beta.to(gpu()).set_requires_grad(true);
    const Tensor y = grn(xg, gg, bg);
    y.backward(g.to(gpu()));
    const std::string what = shape_str(shape);
    EXPECT_TRUE(all_close(y.cpu(), from_vector(emu.y, shape), 1e-6, 1e-6)) << what;
    EXPECT_TRUE(all_close(xg.grad().cpu(), from_vector(emu.dx, shape), 1e-5, 1e-6)) << what;
    EXPECT_TRUE(all_close(gg.grad().cpu(), from_vector(emu.dgamma, {c}), 1e-5, 1e-6)) << what;
    EXPECT_TRUE(all_close(bg.grad().cpu(), from_vector(emu.dbeta, {c}), 1e-6, 1e-6)) << what;
  }
}

// The timed search runs only with reproducibility off (Note [Reproducible runs]); on cuDNN's depthwise path.
TEST(CudaOps, ConvAlgorithmSearchModesAgree) {
  CZ_REQUIRE_GPU();
  cuda::set_depthwise_algo(cuda::DepthwiseAlgo::cudnn);
  cuda::set_reproducible(false);
  const Tensor x = r32({2, 14, 14, 96}, 21).to(gpu()), w = r32({96, 1, 7, 7}, 22).to(gpu());
  NoGradGuard no_grad;
  const Tensor heuristic = depthwise_conv2d(x, w);
  cuda::set_conv_benchmark(true);
  const Tensor timed = depthwise_conv2d(x, w);
  const Tensor timed_again = depthwise_conv2d(x, w);  // from the cache
  cuda::set_conv_benchmark(false);
  EXPECT_TRUE(all_close(timed, heuristic, 1e-5, 1e-5));
  EXPECT_TRUE(same_bits(timed, timed_again));
  // bf16 through the tensor-op path.
  const Tensor xb = x.to(DType::bf16), wb = w.to(DType::bf16);
  EXPECT_TRUE(all_close(depthwise_conv2d(xb, wb).to(DType::f32), heuristic, 3e-2, 3e-2));
  cuda::set_reproducible(true);
  cuda::set_depthwise_algo(cuda::DepthwiseAlgo::tiled);
}

// Patchify as one GEMM over its patches (the fallback for problems cuDNN cannot run), forced on: the stem,
// a downsampling, and floor remainders with an odd channel count, in f32 and bf16.
TEST(CudaOps, PatchifyAsGemmMatchesCpu) {
  CZ_REQUIRE_GPU();
  cuda::set_patchify_gemm(true);
  auto patchify = [](const auto& in) { return patchify_conv2d(in[0], in[1], in[2]); };
  check_large("stem_4x4_gemm", patchify, {r32({2, 64, 64, 3}, 7), r32({96, 3, 4, 4}, 8), r32({96}, 9)}, 1e-4);
  check_large("downsample_2x2_gemm", patchify,
              {r32({2, 14, 14, 192}, 10), r32({384, 192, 2, 2}, 11), r32({384}, 12)}, 1e-4);
  check_large("patchify_remainder_gemm", patchify,
              {r32({2, 9, 13, 67}, 13), r32({40, 67, 4, 4}, 14), r32({40}, 15)}, 1e-4);
  // bf16 on the GPU against the CPU in f32 from the same bf16-rounded inputs.
  const Tensor x = r32({2, 9, 13, 67}, 16).to(DType::bf16), w = r32({40, 67, 2, 2}, 17).to(DType::bf16);
  const Tensor ref = patchify_conv2d(x.to(DType::f32), w.to(DType::f32), Tensor());
  const Tensor bf = patchify_conv2d(x.to(gpu()), w.to(gpu()), Tensor());
  EXPECT_TRUE(all_close(bf.to(DType::f32).cpu(), ref, 3e-2, 3e-2));
  cuda::set_patchify_gemm(false);
}

// Every depthwise path against the CPU in f32 and twice on the GPU, expecting the same bits (the weight
// gradient's partials are added in a fixed order): the tiled kernels (default), cuDNN (the fallback) and the
// direct kernels, k = 7 at odd sizes (C not a multiple of 8, H and W below the tile, N = 1 and 3) and at a
// ConvNeXt shape; the direct kernels and cuDNN also for k = 3, 5, 9.
TEST(CudaOps, DepthwisePathsMatchCpuAndRepeatBitForBit) {
  CZ_REQUIRE_GPU();
  auto dw = [](const auto& in) { return depthwise_conv2d(in[0], in[1], in[2]); };
  for (cuda::DepthwiseAlgo algo :
       {cuda::DepthwiseAlgo::tiled, cuda::DepthwiseAlgo::cudnn, cuda::DepthwiseAlgo::direct}) {
    cuda::set_depthwise_algo(algo);
    const std::string name = std::string("depthwise_") + cuda::depthwise_algo_name(algo);
    for (const Shape& x : std::vector<Shape>{{1, 5, 9, 19}, {3, 9, 13, 67}, {3, 1, 2, 40}, {2, 28, 28, 192}})
      check_large(name.c_str(), dw, {r32(x, 30), r32({x[3], 1, 7, 7}, 31), r32({x[3]}, 32)}, 1e-4);
    if (algo != cuda::DepthwiseAlgo::tiled)
      for (int64_t k : {3, 5, 9})
        check_large(name.c_str(), dw,
                    {r32({2, 9, 13, 67}, 30 + k), r32({67, 1, k, k}, 40 + k), r32({67}, 50 + k)}, 1e-4);
  }
  cuda::set_depthwise_algo(cuda::DepthwiseAlgo::tiled);
}

// bf16 and f16 (f32 accumulation, one rounding per output) on every path against the CPU in f32 on the same
// rounded inputs, and twice, expecting the same bits. C = 67 leaves a partial 32-channel group.
TEST(CudaOps, DepthwisePaths16BitMatchCpuF32) {
  CZ_REQUIRE_GPU();
  for (cuda::DepthwiseAlgo algo :
       {cuda::DepthwiseAlgo::tiled, cuda::DepthwiseAlgo::cudnn, cuda::DepthwiseAlgo::direct})
    for (DType t : {DType::bf16, DType::f16})
      for (int64_t k : {3, 7}) {
        cuda::set_depthwise_algo(algo);
        auto run = [&](Device d, DType dt) {
          std::vector<Tensor> in;
          for (const Tensor& h : {r32({3, 9, 13, 67}, 70 + k), r32({67, 1, k, k}, 80 + k), r32({67}, 90 + k)})
            in.push_back(h.to(t).to(dt).to(d).detach().set_requires_grad(true));
          Tensor out = depthwise_conv2d(in[0], in[1], in[2]);
          const Tensor g = r32(out.sizes(), 99).to(t).to(dt).to(d);
          sum(mul(out, g)).backward();
          std::vector<Tensor> r{out.detach().to(DType::f32)};
          for (const Tensor& x : in) r.push_back(x.grad().to(DType::f32));
          return r;
        };
        const auto cpu_r = run(Device::cpu(), DType::f32);
        const auto gpu_a = run(gpu(), t), gpu_b = run(gpu(), t);
        const double tol = t == DType::bf16 ? 2e-2 : 1e-2;
        for (size_t i = 0; i < cpu_r.size(); ++i) {
          EXPECT_TRUE(all_close(gpu_a[i], cpu_r[i], tol, tol * (i >= 2 ? 10 : 1)))
              << cuda::depthwise_algo_name(algo) << " " << dtype_name(t) << " k " << k << " result " << i;
          EXPECT_TRUE(same_bits(gpu_a[i], gpu_b[i]))
              << cuda::depthwise_algo_name(algo) << " " << dtype_name(t) << " k " << k << " result " << i
              << " differs between two runs";
        }
      }
  cuda::set_depthwise_algo(cuda::DepthwiseAlgo::tiled);
}

// The tiled kernels give exactly the bits of their CPU emulation (depthwise_emulation.h: the same phases,
// FMAs and roundings), through the 16-byte and the element-by-element staging paths.
template <class T>
void expect_tiled_equals_emulation(const Shape& xs, uint64_t seed) {
  const DType t = dtype_of<T>;
  const int64_t n = xs[0], h = xs[1], w = xs[2], c = xs[3];
  const Tensor x = r32(xs, seed).to(t), wk = r32({7, 7, c}, seed + 1).to(t), b = r32({c}, seed + 2).to(t),
               gy = r32(xs, seed + 3).to(t);
  const Stream s = current_stream(gpu());
  const Tensor xg = x.to(gpu()), wg = wk.to(gpu()), bg = b.to(gpu()), gg = gy.to(gpu());
  Tensor y = empty(xs, t, gpu()), dx = empty(xs, t, gpu()), dwg = empty({7, 7, c}, t, gpu()),
         db = empty({c}, t, gpu());
  cuda::depthwise_conv2d_forward(xg, wg, bg, y, s);
  cuda::depthwise_conv2d_backward(gg, xg, wg, dx, dwg, db, s);
  Tensor ey = empty(xs, t), edx = empty(xs, t), edw = empty({7, 7, c}, t), edb = empty({c}, t);
  const int sms = cuda::context(0).sm_count();
  emulate_depthwise7_forward<T>(x.data<T>(), wk.data<T>(), b.data<T>(), ey.data<T>(), n, h, w, c, false, sms);
  emulate_depthwise7_backward<T>(gy.data<T>(), x.data<T>(), wk.data<T>(), edx.data<T>(), edw.data<T>(),
                                 edb.data<T>(), n, h, w, c, sms);
  const std::string what = ::testing::PrintToString(xs) + " " + std::string(dtype_name(t));
  EXPECT_TRUE(same_bits(y.cpu(), ey)) << what << ": forward";
  EXPECT_TRUE(same_bits(dx.cpu(), edx)) << what << ": dx";
  EXPECT_TRUE(same_bits(dwg.cpu(), edw)) << what << ": dw";
  EXPECT_TRUE(same_bits(db.cpu(), edb)) << what << ": db";
}

TEST(CudaOps, TiledDepthwiseKernelsEqualTheirCpuEmulation) {
  CZ_REQUIRE_GPU();
  ASSERT_EQ(cuda::context(0).depthwise_algo(), cuda::DepthwiseAlgo::tiled);
  for (const Shape& xs : std::vector<Shape>{{3, 9, 13, 67}, {1, 5, 9, 16}, {2, 14, 14, 40}}) {
    expect_tiled_equals_emulation<float>(xs, 200);
    expect_tiled_equals_emulation<BFloat16>(xs, 300);
    expect_tiled_equals_emulation<Half>(xs, 400);
  }
}

}  // namespace
}  // namespace cz::testing
