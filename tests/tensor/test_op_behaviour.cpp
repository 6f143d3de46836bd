// The ConvNeXt ops beyond the op table: f32 GELU accuracy over the whole range, results that do not depend on
// the thread count at shapes large enough to run in parallel, numerical stability, argmax ties, drop path's
// mask, GRN on a channel that is zero.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "common/gradcheck.h"
#include "common/threads.h"
#include "op_reference.h"
#include "tensor/autograd/engine.h"
#include "tensor/cpu/kernels.h"
#include "tensor/ops.h"
#include "tensor/patches.h"
#include "tensor/random.h"

namespace cz::testing {
namespace {

struct BigCase {
  const char* name;
  std::function<std::vector<Tensor>(DType)> inputs;
  TensorFn fn, reference;
};

// Shapes above the parallel grain, with the ConvNeXt-atto channel counts (40 = 16 + 16 + 8 f32 lanes).
std::vector<BigCase> big_cases() {
  auto in = [](const Shape& s, DType t, uint64_t seed) { return random_tensor(s, seed, DType::f64).to(t); };
  return {
      {"depthwise_conv2d",
       [=](DType t) {
         return std::vector{in({3, 16, 13, 40}, t, 1), in({40, 1, 7, 7}, t, 2), in({40}, t, 3)};
       },
       [](const auto& x) { return depthwise_conv2d(x[0], x[1], x[2]); },
       [](const auto& x) { return ref_depthwise_conv2d(x[0], x[1], &x[2]); }},
      {"layer_norm",
       [=](DType t) {
         return std::vector{in({3, 13, 11, 160}, t, 4), in({160}, t, 5), in({160}, t, 6)};
       },
       [](const auto& x) { return layer_norm(x[0], x[1], x[2], 1e-6); },
       [](const auto& x) { return ref_layer_norm(x[0], &x[1], &x[2], 1e-6); }},
      {"gelu",
       [=](DType t) {
         return std::vector{in({5, 17, 19, 40}, t, 7)};
       },
       [](const auto& x) { return gelu(x[0]); }, [](const auto& x) { return ref_gelu(x[0]); }},
      {"patchify_conv2d",
       [=](DType t) {
         return std::vector{in({3, 34, 32, 3}, t, 8), in({40, 3, 4, 4}, t, 9), in({40}, t, 10)};
       },
       [](const auto& x) { return patchify_conv2d(x[0], x[1], x[2]); },
       [](const auto& x) { return ref_patchify_conv2d(x[0], x[1], &x[2]); }},
      // Tall enough that the weight gradient splits its rows across threads (cpu/linear.cpp).
      {"linear_tall",
       [=](DType t) {
         return std::vector{in({4099, 24}, t, 12), in({40, 24}, t, 13), in({40}, t, 14)};
       },
       [](const auto& x) { return linear(x[0], x[1], x[2]); },
       [](const auto& x) { return ref_linear(x[0], x[1], &x[2]); }},
      {"global_avg_pool",
       [=](DType t) {
         return std::vector{in({5, 9, 11, 80}, t, 11)};
       },
       [](const auto& x) { return global_avg_pool(x[0]); },
       [](const auto& x) { return ref_global_avg_pool(x[0]); }},
      {"grn",
       [=](DType t) {
         return std::vector{in({3, 16, 13, 40}, t, 15), in({40}, t, 16), in({40}, t, 17)};
       },
       [](const auto& x) { return grn(x[0], x[1], x[2]); },
       [](const auto& x) { return ref_grn(x[0], x[1], x[2], 1e-6); }},
  };
}

TEST(OpBehaviour, ParallelResultsMatchReferenceAndSerialRun) {
  for (const BigCase& c : big_cases()) {
    SCOPED_TRACE(c.name);
    const auto in64 = c.inputs(DType::f64);
    const auto serial = with_threads(1, [&] { return output_and_grads(c.fn, in64); });
    const auto parallel = with_threads(3, [&] { return output_and_grads(c.fn, in64); });
    EXPECT_TRUE(all_close(parallel[0], c.reference(in64), 1e-10, 1e-12));
    for (size_t i = 0; i < serial.size(); ++i) EXPECT_TRUE(all_close(parallel[i], serial[i], 1e-11, 1e-11));
    // The f32 kernels (other vector widths) against f64, values and gradients.
    const auto f32 = with_threads(2, [&] { return output_and_grads(c.fn, c.inputs(DType::f32)); });
    for (size_t i = 0; i < serial.size(); ++i) EXPECT_TRUE(all_close(f32[i], serial[i], 1e-4, 1e-4)) << i;
  }
}

TEST(OpBehaviour, NonContiguousInputsGiveTheSameResults) {
  // x (N, H, W, C) as a permuted view of an (N, C, H, W) tensor; parameters as strided views.
  const Tensor x = random_tensor({2, 6, 5, 7}, 31).permute({0, 2, 3, 1});
  ASSERT_FALSE(x.is_contiguous());
  const Tensor xc = x.contiguous();
  const Tensor w7 = random_tensor({6, 1, 3, 3}, 32), b6 = random_tensor({6}, 33);
  const Tensor wide = random_tensor({6, 2}, 34), gamma = wide.select(1, 0), beta = wide.select(1, 1);
  ASSERT_FALSE(gamma.is_contiguous());
  const Tensor wp = random_tensor({4, 6, 2, 2}, 35).permute({0, 1, 3, 2});
  auto same = [](const Tensor& a, const Tensor& b) { return all_close(a, b, 1e-14, 1e-14); };
  EXPECT_TRUE(same(gelu(x), gelu(xc)));
  EXPECT_TRUE(
      same(layer_norm(x, gamma, beta, 1e-5), layer_norm(xc, gamma.contiguous(), beta.contiguous(), 1e-5)));
  EXPECT_TRUE(same(depthwise_conv2d(x, w7, b6), depthwise_conv2d(xc, w7, b6)));
  EXPECT_TRUE(same(patchify_conv2d(x, wp), patchify_conv2d(xc, wp.contiguous())));
  EXPECT_TRUE(same(global_avg_pool(x), global_avg_pool(xc)));
  EXPECT_TRUE(same(grn(x, gamma, beta), grn(xc, gamma.contiguous(), beta.contiguous())));
  Generator g1(5), g2(5);
  EXPECT_TRUE(same(drop_path(x, 0.5, g1), drop_path(xc, 0.5, g2)));
  const Tensor logits = random_tensor({3, 5}, 36).transpose(0, 1);  // (5, 3)
  const Tensor labels = from_vector(std::vector<int64_t>{0, 2, 1, 1, 2, 0}, {6}).narrow(0, 1, 5);
  EXPECT_NEAR(cross_entropy(logits, labels, 0.1).item(),
              cross_entropy(logits.contiguous(), labels.contiguous(), 0.1).item(), 1e-14);
  EXPECT_EQ(argmax(logits).to_vector<int64_t>(), argmax(logits.contiguous()).to_vector<int64_t>());
}

// Note [Streaming gradient copies]: copy_streaming_ writes exactly what copy_ writes, whatever the
// destination's alignment (the ordinary head and tail around the streamed lines), at sizes on both sides of
// the threshold, in any dtype of one size, at one thread and at several, and falls back to copy_ where the
// dtypes differ or a side is strided.
TEST(OpBehaviour, StreamingCopyWritesWhatCopyWrites) {
  const int64_t threshold = cpu::kStreamingCopyBytes / 4;
  for (const int threads : {1, 3})
    for (const DType dt : {DType::f32, DType::bf16})
      for (const int64_t n :
           {int64_t(0), int64_t(1), int64_t(15), threshold - 1, threshold + 7, int64_t(300001)})
        for (const int64_t skew : {0, 1, 5, 15}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dt) << " n " << n << " skew " << skew << " threads " << threads);
          const Tensor src = random_tensor({n + 16}, 7, DType::f32).to(dt).narrow(0, 16 - skew, n);
          Tensor out = full({n + 32}, 3.0, dt), ref = full({n + 32}, 3.0, dt);
          with_threads(threads, [&] { return out.narrow(0, skew, n).copy_streaming_(src); });
          ref.narrow(0, skew, n).copy_(src);
          EXPECT_EQ(out.to(DType::f32).to_vector<float>(), ref.to(DType::f32).to_vector<float>());
        }
  // Fallbacks: a conversion, and a strided source.
  const Tensor src = random_tensor({4096, 8}, 8, DType::f32);
  Tensor half = empty({4096, 8}, DType::bf16);
  half.copy_streaming_(src);
  EXPECT_EQ(half.to_vector<float>(), src.to(DType::bf16).to_vector<float>());
  Tensor t = empty({8, 4096}, DType::f32);
  t.copy_streaming_(src.transpose(0, 1));
  EXPECT_EQ(t.to_vector<float>(), src.transpose(0, 1).contiguous().to_vector<float>());
}

TEST(OpBehaviour, EmptyBatch) {
  const Tensor x = zeros({0, 4, 4, 8});
  EXPECT_EQ(gelu(x).sizes(), x.sizes());
  EXPECT_EQ(layer_norm(x, ones({8}), zeros({8}), 1e-6).sizes(), x.sizes());
  EXPECT_EQ(depthwise_conv2d(x, ones({8, 1, 7, 7})).sizes(), x.sizes());
  EXPECT_EQ(patchify_conv2d(x, ones({3, 8, 2, 2})).sizes(), (Shape{0, 2, 2, 3}));
  EXPECT_EQ(global_avg_pool(x).sizes(), (Shape{0, 8}));
  EXPECT_EQ(grn(x, ones({8}), zeros({8})).sizes(), x.sizes());
  Generator gen(1);
  EXPECT_EQ(drop_path(x, 0.5, gen).sizes(), x.sizes());
}

// A channel that is zero over a whole image (its norm 0): GRN passes it through as beta, and its input
// gradient is the output gradient alone (torch's norm has a zero gradient at zero), finite, in f64 and f32.
TEST(OpBehaviour, GrnZeroChannelHasTheOutputGradient) {
  for (DType t : {DType::f64, DType::f32}) {
    std::vector<double> xv = random_tensor({2, 3, 4, 5}, 41, DType::f64).to_vector<double>();
    for (size_t p = 0; p < 12; ++p) xv[(12 + p) * 5 + 2] = 0;  // image 1, channel 2
    Tensor x = from_vector(xv, {2, 3, 4, 5}).to(t).set_requires_grad(true);
    const Tensor gamma = random_tensor({5}, 42, DType::f64).to(t),
                 beta = random_tensor({5}, 43, DType::f64).to(t);
    const Tensor g = random_tensor({2, 3, 4, 5}, 44, DType::f64).to(t);
    const Tensor y = grn(x, gamma, beta);
    y.backward(g);
    const auto yv = y.to_vector<double>(), dx = x.grad().to_vector<double>(), gv = g.to_vector<double>();
    for (double v : dx) EXPECT_TRUE(std::isfinite(v)) << dtype_name(t);
    for (size_t p = 0; p < 12; ++p) {
      const size_t i = (12 + p) * 5 + 2;
      EXPECT_EQ(dx[i], gv[i]) << dtype_name(t) << " pixel " << p;
      EXPECT_EQ(yv[i], beta.to_vector<double>()[2]) << dtype_name(t) << " pixel " << p;
    }
  }
}

TEST(OpBehaviour, GeluF32IsAccurateOverTheWholeRange) {
  const int64_t n = 200001;
  std::vector<float> xs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xs[size_t(i)] = float(-15.0 + 30.0 * double(i) / double(n - 1));
  const Tensor x = from_vector(xs, {n});
  const auto y = gelu(x).to_vector<double>();
  Tensor xg = x.clone().set_requires_grad(true);
  gelu(xg).backward(ones({n}));
  const auto dy = xg.grad().to_vector<double>();
  double worst = 0, worst_grad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = xs[size_t(i)], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double pdf_term = v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    const double ref = v * cdf, ref_grad = cdf + pdf_term;
    if (std::abs(ref) > 1e-30) worst = std::max(worst, std::abs(y[size_t(i)] - ref) / std::abs(ref));
    // The derivative's two terms cancel near x = -0.75: measure the error against their size.
    const double scale = cdf + std::abs(pdf_term);
    if (scale > 1e-30) worst_grad = std::max(worst_grad, std::abs(dy[size_t(i)] - ref_grad) / scale);
  }
  EXPECT_LT(worst, 1e-6);  // measured: 4.8e-7
  EXPECT_LT(worst_grad, 1e-6);
  // Far tails: exactly x and 0, no NaN.
  const auto tails =
      gelu(from_vector(std::vector<float>{-100.f, 100.f, -1e30f, 1e30f}, {4})).to_vector<float>();
  EXPECT_EQ(tails[0], 0.0f);
  EXPECT_EQ(tails[1], 100.0f);
  EXPECT_EQ(tails[2], 0.0f);
  EXPECT_EQ(tails[3], 1e30f);
}

TEST(OpBehaviour, LayerNormF32VarianceDoesNotCancel) {
  // Mean 300, std 0.6: E[x^2] - E[x]^2 in f32 would be off by about 1% here.
  const Tensor x64 = add(random_tensor({64, 40}, 21), full({64, 40}, 300.0, DType::f64));
  const Tensor x32 = x64.to(DType::f32);
  const Tensor ref = ref_layer_norm(x32, nullptr, nullptr, 1e-6);  // from the same f32 values, in f64
  EXPECT_TRUE(all_close(layer_norm(x32, Tensor(), Tensor(), 1e-6), ref, 1e-3, 1e-3));
}

TEST(OpBehaviour, CrossEntropyIsStableForLargeLogits) {
  const Tensor z = random_tensor({4, 9}, 5, DType::f32, -3, 3);
  const Tensor y = from_vector(std::vector<int64_t>{0, 8, 3, 3}, {4});
  const double base = cross_entropy(z, y, 0.1).item();
  const double shifted = cross_entropy(add(z, full({4, 9}, 1000.0)), y, 0.1).item();
  EXPECT_TRUE(std::isfinite(shifted));
  EXPECT_NEAR(base, shifted, 1e-4);
  // Two equal logits: log 2, whatever the smoothing.
  const Tensor two = zeros({1, 2});
  EXPECT_NEAR(cross_entropy(two, from_vector(std::vector<int32_t>{1}, {1}), 0.3).item(), std::log(2.0), 1e-7);
}

// Soft targets equal to cross_entropy's smoothed one-hot rows give cross_entropy's loss and gradient; a
// large common shift of the logits changes neither.
TEST(OpBehaviour, SoftTargetCrossEntropyWithSmoothedOneHotIsCrossEntropy) {
  const Tensor z = random_tensor({5, 9}, 7, DType::f32, -3, 3);
  const std::vector<int64_t> y = {0, 8, 3, 3, 5};
  std::vector<float> t(5 * 9, float(0.1 / 9));
  for (size_t n = 0; n < 5; ++n) t[n * 9 + size_t(y[n])] += 0.9f;
  const Tensor targets = from_vector(t, {5, 9}), labels = from_vector(y, {5});
  Tensor za = z.clone().set_requires_grad(true), zb = z.clone().set_requires_grad(true);
  const Tensor soft = soft_target_cross_entropy(za, targets), hard = cross_entropy(zb, labels, 0.1);
  EXPECT_NEAR(soft.item(), hard.item(), 1e-6);
  soft.backward();
  hard.backward();
  EXPECT_TRUE(all_close(za.grad(), zb.grad(), 1e-5, 1e-7));
  // z + 1000 in f32 moves each logit by up to half an ulp at 1000 (3e-5): the loss moves as much, no more.
  const double shifted = soft_target_cross_entropy(add(z, full({5, 9}, 1000.0)), targets).item();
  EXPECT_TRUE(std::isfinite(shifted));
  EXPECT_NEAR(shifted, soft.item(), 1e-4);
  // A non-contiguous view of the targets reads the same values.
  const Tensor wide = from_vector(t, {5, 9}).transpose(0, 1).contiguous().transpose(0, 1);
  ASSERT_FALSE(wide.is_contiguous());
  EXPECT_EQ(soft_target_cross_entropy(z, wide).item(), soft_target_cross_entropy(z, targets).item());
}

TEST(OpBehaviour, ArgmaxTakesTheFirstMaximumAndNaN) {
  const Tensor x = from_vector(std::vector<double>{1, 3, 3, 0,    //
                                                   NAN, 5, 1, 2,  //
                                                   -1, -1, -1, -1},
                               {3, 4});
  EXPECT_EQ(argmax(x).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  const Tensor x3 = random_tensor({2, 3, 5}, 3);
  const Tensor a = argmax(x3);
  EXPECT_EQ(a.sizes(), (Shape{2, 3}));
  const auto v = x3.to_vector<double>();
  const auto av = a.to_vector<int64_t>();
  for (size_t r = 0; r < 6; ++r)
    for (size_t k = 0; k < 5; ++k) EXPECT_LE(v[r * 5 + k], v[r * 5 + size_t(av[r])]);
  const Tensor logits = from_vector(std::vector<float>{0, 1, 2, 5, 1, 0, 0, 0, 1}, {3, 3});
  EXPECT_EQ(count_correct(logits, from_vector(std::vector<int64_t>{2, 0, 1}, {3})), 2);
  EXPECT_EQ(count_correct(logits, from_vector(std::vector<int32_t>{2, 0, 2}, {3})), 3);
}

// Top-k against a sort of each row: NaN first, then by value, the lower index first among equals (argmax's
// order); top-1 is count_correct.
TEST(OpBehaviour, CountTopKRanksAsArgmaxAndSortDo) {
  const Tensor x = from_vector(std::vector<float>{1, 3, 3, 0, 2,    //
                                                  NAN, 5, 1, 2, 2,  //
                                                  -1, -1, -1, -1, -1},
                               {3, 5});
  const Tensor y = from_vector(std::vector<int64_t>{2, 0, 4}, {3});
  // Row 0: order 1, 2, 4, 0, 3 -> label 2 is second. Row 1: NaN first. Row 2: all equal -> label 4 is last.
  EXPECT_EQ(count_top_k(x, y, 1), 1);
  EXPECT_EQ(count_top_k(x, y, 2), 2);
  EXPECT_EQ(count_top_k(x, y, 4), 2);
  EXPECT_EQ(count_top_k(x, y, 5), 3);
  const Tensor logits = random_tensor({64, 10}, 5, DType::f32);
  const Tensor rounded = from_vector(
      [&] {  // coarse values: many ties
        std::vector<float> v = logits.to_vector<float>();
        for (float& e : v) e = std::round(e * 2) / 2;
        return v;
      }(),
      {64, 10});
  std::vector<int64_t> labels(64);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t((i * 7 + i / 3) % 10);
  const Tensor yl = from_vector(labels, {64});
  for (const Tensor& z : {logits, rounded}) {
    const std::vector<float> v = z.to_vector<float>();
    EXPECT_EQ(count_top_k(z, yl, 1), count_correct(z, yl));
    for (int64_t k = 1; k <= 10; ++k) {
      int64_t expected = 0;
      for (int64_t i = 0; i < 64; ++i) {
        std::vector<int64_t> order(10);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return v[i * 10 + a] > v[i * 10 + b]; });
        expected += std::find(order.begin(), order.begin() + k, labels[size_t(i)]) != order.begin() + k;
      }
      EXPECT_EQ(count_top_k(z, yl, k), expected) << "k " << k;
    }
  }
  EXPECT_THROW(count_top_k(x, y, 6), ValueError);
  EXPECT_THROW(count_top_k(x, y, 0), ValueError);
}

TEST(OpBehaviour, DropPathMask) {
  Generator gen(3);
  const Tensor x = random_tensor({8, 2, 3, 5}, 1).set_requires_grad(true);
  EXPECT_TRUE(drop_path(x, 0.0, gen).same(x));
  EXPECT_EQ(gen.offset(), 0u);  // p = 0 draws nothing

  // The op table's drop_path case (seed 3, p = 0.4, 8 samples) must keep some samples and drop others.
  const Tensor y = drop_path(x, 0.4, gen);
  const auto yv = y.to_vector<double>(), xv = x.to_vector<double>();
  int kept = 0;
  for (size_t n = 0; n < 8; ++n) {
    const double ratio = yv[n * 30] / xv[n * 30];
    EXPECT_TRUE(ratio == 0.0 || std::abs(ratio - 1 / 0.6) < 1e-12) << ratio;
    for (size_t i = 1; i < 30; ++i) EXPECT_NEAR(yv[n * 30 + i], ratio * xv[n * 30 + i], 1e-12);
    kept += ratio != 0.0;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 8);
  // The gradient is the same mask.
  y.backward(ones(y.sizes(), y.dtype()));
  const auto g = x.grad().to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], yv[i] / xv[i], 1e-12);

  // Same generator state, same mask; the generator advances.
  Generator a(11), b(11);
  const Tensor big = ones({20000, 3});
  const auto ma = drop_path(big, 0.3, a).to_vector<float>(), mb = drop_path(big, 0.3, b).to_vector<float>();
  EXPECT_EQ(ma, mb);
  EXPECT_NE(drop_path(big, 0.3, a).to_vector<float>(), ma);
  double kept_fraction = 0;
  for (size_t n = 0; n < 20000; ++n) kept_fraction += ma[n * 3] != 0.0f;
  EXPECT_NEAR(kept_fraction / 20000, 0.7, 0.015);
}

// Note [Patchify as a GEMM]: what the CUDA backend runs where cuDNN has no algorithm, built here from the CPU
// kernels (the same gather, GEMM and scatter) and held against the CPU's convolution kernels, with floor
// remainders in H and W and odd channel counts.
TEST(OpBehaviour, PatchifyAsOneGemmEqualsTheConvolution) {
  struct Case {
    int64_t n, h, w, c, cout, k;
  };
  for (const Case& t : {Case{2, 8, 8, 3, 5, 4}, Case{1, 9, 5, 4, 6, 2}, Case{2, 7, 10, 3, 4, 3}}) {
    SCOPED_TRACE(::testing::Message()
                 << "x (" << t.n << ", " << t.h << ", " << t.w << ", " << t.c << "), k " << t.k);
    const int64_t ho = t.h / t.k, wo = t.w / t.k, rows = t.n * ho * wo, kkc = t.k * t.k * t.c;
    const Tensor x = random_tensor({t.n, t.h, t.w, t.c}, 1), w = random_tensor({t.cout, t.k, t.k, t.c}, 2);
    const Tensor b = random_tensor({t.cout}, 3), gy = random_tensor({t.n, ho, wo, t.cout}, 4);

    Tensor y_ref = empty({t.n, ho, wo, t.cout}, DType::f64);
    Tensor dx_ref = empty_like(x), dw_ref = empty_like(w), db_ref = empty_like(b);
    cpu::patchify_conv2d_forward(x, w, b, y_ref);
    cpu::patchify_conv2d_backward(gy, x, w, dx_ref, dw_ref, db_ref);

    Tensor p = empty({rows, kkc}, DType::f64);
    Tensor p6 = p.view({t.n, ho, wo, t.k, t.k, t.c});
    cpu::copy(patches_view(x, t.k), p6);
    Tensor y = empty({t.n, ho, wo, t.cout}, DType::f64), y2d = y.view({rows, t.cout});
    cpu::linear_forward(p, w.view({t.cout, kkc}), b, y2d);
    EXPECT_TRUE(all_close(y, y_ref, 1e-12, 1e-12));

    Tensor dp = empty_like(p), dw2d = empty({t.cout, kkc}, DType::f64), db = empty_like(b);
    cpu::linear_backward(gy.view({rows, t.cout}), p, w.view({t.cout, kkc}), dp, dw2d, db);
    Tensor dx = full(x.sizes(), 7.0, DType::f64);  // not zero: the dropped rows must be cleared
    if (t.h % t.k != 0 || t.w % t.k != 0) cpu::fill(dx, 0.0);
    Tensor dx_patches = patches_view(dx, t.k);
    cpu::copy(dp.view(dx_patches.sizes()), dx_patches);
    EXPECT_TRUE(all_close(dx, dx_ref, 1e-12, 1e-12));
    EXPECT_TRUE(all_close(dw2d.view(w.sizes()), dw_ref, 1e-12, 1e-12));
    EXPECT_TRUE(all_close(db, db_ref, 1e-12, 1e-12));
  }
}

// The stem's weight gradient has many rows against a small weight, and so (fast cut, Note [Cutting the rows])
// is summed by one block of rows per thread, its bias gradient in the same pass: on 2 and 3 threads it equals
// the one GEMM of a single thread to rounding, and the input gradient does not change.
TEST(OpBehaviour, PatchifyWeightGradientSplitByRowsEqualsOneGemm) {
  const int64_t n = 2, h = 64, w = 64, c = 3, cout = 5, k = 2;  // 2048 rows of 12 patch values
  const Tensor x = random_tensor({n, h, w, c}, 1), wt = random_tensor({cout, k, k, c}, 2);
  const Tensor gy = random_tensor({n, h / k, w / k, cout}, 4);
  const auto grads = [&] {
    Tensor dx = empty_like(x), dw = empty_like(wt), db = empty({cout}, DType::f64);
    cpu::patchify_conv2d_backward(gy, x, wt, dx, dw, db);
    return std::vector<Tensor>{dx, dw, db};
  };
  const auto one = with_threads(1, grads);
  for (int threads : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    const auto split = with_threads(threads, grads);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(all_close(split[i], one[i], 1e-12, 1e-12)) << i;
  }
  // Only the bias gradient asked for: the column sums alone.
  Tensor none, db = empty({cout}, DType::f64);
  with_threads(2, [&] {
    cpu::patchify_conv2d_backward(gy, x, wt, none, none, db);
    return 0;
  });
  EXPECT_TRUE(all_close(db, one[2], 1e-12, 1e-12));
}

}  // namespace
}  // namespace cz::testing
