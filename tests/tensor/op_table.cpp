// The op table: inputs, the op, and a naive reference for every differentiable op.
#include "op_table.h"

#include <cmath>

#include "op_reference.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace cz::testing {

std::vector<double> host(const Tensor& t) {
  return t.to_vector<double>();
}
Tensor make(const std::vector<double>& v, const Shape& shape) {
  return from_vector(v, shape);
}

Tensor input(const Shape& shape, DType dtype, uint64_t seed, bool grad, double lo, double hi) {
  Tensor t = random_tensor(shape, seed, DType::f64, lo, hi).to(dtype);
  if (grad) t.set_requires_grad(true);
  return t;
}

namespace {

TensorFn elementwise_ref(double (*f)(double, double)) {
  return [f](const std::vector<Tensor>& in) {
    auto a = host(in[0]), b = host(in[1]);
    for (size_t i = 0; i < a.size(); ++i) a[i] = f(a[i], b[i]);
    return make(a, in[0].sizes());
  };
}

// Class labels in [0, k) of the given integer dtype (never requiring grad).
Tensor labels(int64_t n, int64_t k, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return randint(k, {n}, gen, dtype);
}

// The ConvNeXt ops. Shapes exercise the edges of the vectorized kernels: channel counts that are not a
// multiple of any SIMD width, images smaller and larger than the kernel, odd patchify remainders.
void add_convnext_cases(std::vector<OpCase>& cases) {
  cases.push_back({"gelu",
                   [](DType t, uint64_t s) {
                     return std::vector{input({2, 3, 5, 7}, t, s, true, -5, 5)};
                   },
                   [](const auto& in) { return gelu(in[0]); },
                   [](const auto& in) { return ref_gelu(in[0]); }});

  cases.push_back({"layer_norm",
                   [](DType t, uint64_t s) {
                     return std::vector{input({2, 3, 5, 21}, t, s, true, -2, 3), input({21}, t, s + 1),
                                        input({21}, t, s + 2)};
                   },
                   [](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-6); },
                   [](const auto& in) { return ref_layer_norm(in[0], &in[1], &in[2], 1e-6); }});
  cases.push_back({"layer_norm_no_affine",
                   [](DType t, uint64_t s) {
                     return std::vector{input({3, 67}, t, s)};
                   },
                   [](const auto& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-5); },
                   [](const auto& in) { return ref_layer_norm(in[0], nullptr, nullptr, 1e-5); }});
  cases.push_back({"layer_norm_weight_only",
                   [](DType t, uint64_t s) {
                     return std::vector{input({2, 70}, t, s), input({70}, t, s + 1)};
                   },
                   [](const auto& in) { return layer_norm(in[0], in[1], Tensor(), 1e-5); },
                   [](const auto& in) { return ref_layer_norm(in[0], &in[1], nullptr, 1e-5); }});
  cases.push_back({"layer_norm_bias_only",
                   [](DType t, uint64_t s) {
                     return std::vector{input({4, 9}, t, s), input({9}, t, s + 1)};
                   },
                   [](const auto& in) { return layer_norm(in[0], Tensor(), in[1], 1e-5); },
                   [](const auto& in) { return ref_layer_norm(in[0], nullptr, &in[1], 1e-5); }});

  // Depthwise: k = 7 with H < k < W and C = 19 (16 + 2 + 1 lanes with AVX-512 f32); k = 5, 3 and the generic
  // path (k = 9), W from 1 to 10 (every register-block width), with and without bias.
  auto dw_case = [&](const char* name, Shape x, int64_t k, bool with_bias) {
    const int64_t C = x[3];
    cases.push_back(
        {name,
         [=](DType t, uint64_t s) {
           std::vector<Tensor> in{input(x, t, s), input({C, 1, k, k}, t, s + 1)};
           if (with_bias) in.push_back(input({C}, t, s + 2));
           return in;
         },
         [](const auto& in) { return depthwise_conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor()); },
         [](const auto& in) {
           return ref_depthwise_conv2d(in[0], in[1], in.size() > 2 ? &in[2] : nullptr);
         }});
  };
  dw_case("depthwise_conv2d_k7", {2, 5, 9, 19}, 7, true);
  dw_case("depthwise_conv2d_k7_w3_no_bias", {1, 8, 3, 5}, 7, false);
  // The tiled CUDA kernels (Note [Tiled depthwise kernels]): C a multiple of 8 (16-byte staging in f32, f16
  // and bf16) with N = 3 and H, W not multiples of the 4 x 7 strip; C = 40 over two 32-channel groups; C = 9.
  dw_case("depthwise_conv2d_k7_c16_n3", {3, 5, 9, 16}, 7, true);
  dw_case("depthwise_conv2d_k7_c40", {1, 3, 4, 40}, 7, true);
  dw_case("depthwise_conv2d_k7_c9", {1, 11, 8, 9}, 7, false);
  dw_case("depthwise_conv2d_k5", {1, 6, 4, 8}, 5, true);
  dw_case("depthwise_conv2d_k3_w1", {2, 3, 1, 3}, 3, true);
  dw_case("depthwise_conv2d_k9_generic", {1, 3, 10, 3}, 9, false);

  // Patchify: the 4x4 stem with H not divisible by 4, and a 2x2 downsampling layer with W odd and no bias.
  cases.push_back(
      {"patchify_conv2d_k4",
       [](DType t, uint64_t s) {
         return std::vector{input({2, 9, 8, 3}, t, s), input({5, 3, 4, 4}, t, s + 1), input({5}, t, s + 2)};
       },
       [](const auto& in) { return patchify_conv2d(in[0], in[1], in[2]); },
       [](const auto& in) { return ref_patchify_conv2d(in[0], in[1], &in[2]); }});
  cases.push_back({"patchify_conv2d_k2_no_bias",
                   [](DType t, uint64_t s) {
                     return std::vector{input({1, 4, 5, 6}, t, s), input({7, 6, 2, 2}, t, s + 1)};
                   },
                   [](const auto& in) { return patchify_conv2d(in[0], in[1]); },
                   [](const auto& in) { return ref_patchify_conv2d(in[0], in[1], nullptr); }});

  cases.push_back({"global_avg_pool",
                   [](DType t, uint64_t s) {
                     return std::vector{input({2, 3, 5, 19}, t, s)};
                   },
                   [](const auto& in) { return global_avg_pool(in[0]); },
                   [](const auto& in) { return ref_global_avg_pool(in[0]); }});

  // GRN: C = 19 off every vector width, images of 15 and 1 pixels.
  cases.push_back({"grn",
                   [](DType t, uint64_t s) {
                     return std::vector{input({2, 3, 5, 19}, t, s, true, -2, 2), input({19}, t, s + 1),
                                        input({19}, t, s + 2)};
                   },
                   [](const auto& in) { return grn(in[0], in[1], in[2]); },
                   [](const auto& in) { return ref_grn(in[0], in[1], in[2], 1e-6); }});
  cases.push_back(
      {"grn_one_pixel",
       [](DType t, uint64_t s) {
         return std::vector{input({3, 1, 1, 6}, t, s), input({6}, t, s + 1), input({6}, t, s + 2)};
       },
       [](const auto& in) { return grn(in[0], in[1], in[2], 1e-3); },
       [](const auto& in) { return ref_grn(in[0], in[1], in[2], 1e-3); }});

  cases.push_back({"cross_entropy_i64",
                   [](DType t, uint64_t s) {
                     return std::vector{input({6, 7}, t, s, true, -3, 3), labels(6, 7, DType::i64, s + 1)};
                   },
                   [](const auto& in) { return cross_entropy(in[0], in[1]); },
                   [](const auto& in) { return ref_cross_entropy(in[0], in[1], 0.0); }});
  cases.push_back({"cross_entropy_i32_smoothing",
                   [](DType t, uint64_t s) {
                     return std::vector{input({5, 11}, t, s, true, -3, 3), labels(5, 11, DType::i32, s + 1)};
                   },
                   [](const auto& in) { return cross_entropy(in[0], in[1], 0.1); },
                   [](const auto& in) { return ref_cross_entropy(in[0], in[1], 0.1); }});

  // Soft targets: rows of a Mixup-like mixture (two smoothed one-hot rows, weights 0.7/0.3), and free
  // positive targets whose rows do not sum to 1, which the gradient must handle too. Both inputs are
  // differentiable.
  cases.push_back({"soft_target_cross_entropy_mixed",
                   [](DType t, uint64_t s) {
                     const Tensor y = labels(6, 7, DType::i64, s + 1);
                     const auto yv = y.to_vector<int64_t>();
                     std::vector<double> tv(6 * 7, 0.1 / 7);
                     for (size_t n = 0; n < 6; ++n) {
                       tv[n * 7 + size_t(yv[n])] += 0.7 * 0.9;
                       tv[n * 7 + size_t(yv[5 - n])] += 0.3 * 0.9;
                     }
                     return std::vector{input({6, 7}, t, s, true, -3, 3),
                                        from_vector(tv, {6, 7}).to(t).set_requires_grad(true)};
                   },
                   [](const auto& in) { return soft_target_cross_entropy(in[0], in[1]); },
                   [](const auto& in) { return ref_soft_target_cross_entropy(in[0], in[1]); }});
  cases.push_back(
      {"soft_target_cross_entropy_free",
       [](DType t, uint64_t s) {
         return std::vector{input({5, 11}, t, s, true, -3, 3), input({5, 11}, t, s + 1, true, 0, 1)};
       },
       [](const auto& in) { return soft_target_cross_entropy(in[0], in[1]); },
       [](const auto& in) { return ref_soft_target_cross_entropy(in[0], in[1]); }});

  // Seed 3 drops some of the 8 samples and keeps others (test_op_behaviour checks that it still does).
  cases.push_back({"drop_path",
                   [](DType t, uint64_t s) {
                     return std::vector{input({8, 2, 3, 5}, t, s)};
                   },
                   [](const auto& in) {
                     Generator gen(3);
                     return drop_path(in[0], 0.4, gen);
                   },
                   [](const auto& in) { return ref_drop_path(in[0], 0.4, 3); }});
}

std::vector<OpCase> build() {
  std::vector<OpCase> cases;
  const Shape nhwc{2, 3, 5, 4};

  cases.push_back({"add",
                   [=](DType t, uint64_t s) {
                     return std::vector{input(nhwc, t, s), input(nhwc, t, s + 1)};
                   },
                   [](const auto& in) { return add(in[0], in[1]); },
                   elementwise_ref([](double a, double b) { return a + b; })});
  cases.push_back({"sub",
                   [=](DType t, uint64_t s) {
                     return std::vector{input(nhwc, t, s), input(nhwc, t, s + 1)};
                   },
                   [](const auto& in) { return sub(in[0], in[1]); },
                   elementwise_ref([](double a, double b) { return a - b; })});
  cases.push_back({"mul",
                   [=](DType t, uint64_t s) {
                     return std::vector{input(nhwc, t, s), input(nhwc, t, s + 1)};
                   },
                   [](const auto& in) { return mul(in[0], in[1]); },
                   elementwise_ref([](double a, double b) { return a * b; })});
  cases.push_back({"scale", [=](DType t, uint64_t s) { return std::vector{input(nhwc, t, s)}; },
                   [](const auto& in) { return scale(in[0], -2.5); },
                   [](const auto& in) {
                     auto a = host(in[0]);
                     for (double& v : a) v *= -2.5;
                     return make(a, in[0].sizes());
                   }});
  auto channel_ref = [](const Tensor* residual, const Tensor& x, const Tensor& gamma) {
    auto xv = host(x), gv = host(gamma);
    std::vector<double> rv = residual ? host(*residual) : std::vector<double>(xv.size(), 0.0);
    const size_t c = gv.size();
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = rv[i] + xv[i] * gv[i % c];
    return make(xv, x.sizes());
  };
  cases.push_back({"channel_scale",
                   [=](DType t, uint64_t s) {
                     return std::vector{input(nhwc, t, s), input({4}, t, s + 1)};
                   },
                   [](const auto& in) { return channel_scale(in[0], in[1]); },
                   [=](const auto& in) { return channel_ref(nullptr, in[0], in[1]); }});
  cases.push_back({"residual_scale_add",
                   [=](DType t, uint64_t s) {
                     return std::vector{input(nhwc, t, s), input(nhwc, t, s + 1), input({4}, t, s + 2)};
                   },
                   [](const auto& in) { return residual_scale_add(in[0], in[1], in[2]); },
                   [=](const auto& in) { return channel_ref(&in[0], in[1], in[2]); }});
  cases.push_back({"matmul",
                   [](DType t, uint64_t s) {
                     return std::vector{input({5, 7}, t, s), input({7, 3}, t, s + 1)};
                   },
                   [](const auto& in) { return matmul(in[0], in[1]); },
                   [](const auto& in) {
                     auto a = host(in[0]), b = host(in[1]);
                     std::vector<double> c(15, 0.0);
                     for (int i = 0; i < 5; ++i)
                       for (int j = 0; j < 3; ++j)
                         for (int k = 0; k < 7; ++k)
                           c[size_t(i * 3 + j)] += a[size_t(i * 7 + k)] * b[size_t(k * 3 + j)];
                     return make(c, {5, 3});
                   }});
  cases.push_back(
      {"linear",
       [](DType t, uint64_t s) {
         return std::vector{input({2, 3, 6}, t, s), input({4, 6}, t, s + 1), input({4}, t, s + 2)};
       },
       [](const auto& in) { return linear(in[0], in[1], in[2]); },
       [](const auto& in) {
         auto x = host(in[0]), w = host(in[1]), b = host(in[2]);
         std::vector<double> y(24);
         for (int r = 0; r < 6; ++r)
           for (int o = 0; o < 4; ++o) {
             double acc = b[size_t(o)];
             for (int i = 0; i < 6; ++i) acc += x[size_t(r * 6 + i)] * w[size_t(o * 6 + i)];
             y[size_t(r * 4 + o)] = acc;
           }
         return make(y, {2, 3, 4});
       }});
  cases.push_back({"linear_no_bias",
                   [](DType t, uint64_t s) {
                     return std::vector{input({5, 6}, t, s), input({3, 6}, t, s + 1)};
                   },
                   [](const auto& in) { return linear(in[0], in[1]); },
                   [](const auto& in) { return matmul(in[0], in[1].transpose(0, 1)); }});
  // The fused MLP ops (Note [Fused epilogues on the CPU]): channel counts off every vector width, rows that
  // are not a multiple of any tile. tests/tensor/test_linear_fused.cpp holds them to the unfused ops with
  // small tiles and several threads.
  cases.push_back({"linear_gelu",
                   [](DType t, uint64_t s) {
                     return std::vector{input({2, 3, 5, 6}, t, s, true, -2, 2), input({13, 6}, t, s + 1),
                                        input({13}, t, s + 2)};
                   },
                   [](const auto& in) { return linear_gelu(in[0], in[1], in[2]); },
                   [](const auto& in) { return ref_gelu(ref_linear(in[0], in[1], &in[2])); }});
  cases.push_back({"linear_gelu_no_bias",
                   [](DType t, uint64_t s) {
                     return std::vector{input({7, 9}, t, s, true, -2, 2), input({17, 9}, t, s + 1)};
                   },
                   [](const auto& in) { return linear_gelu(in[0], in[1]); },
                   [](const auto& in) { return ref_gelu(ref_linear(in[0], in[1], nullptr)); }});
  cases.push_back({"linear_scale_residual",
                   [](DType t, uint64_t s) {
                     return std::vector{input({3, 5, 7, 7}, t, s), input({3, 5, 7, 26}, t, s + 1),
                                        input({7, 26}, t, s + 2), input({7}, t, s + 3), input({7}, t, s + 4)};
                   },
                   [](const auto& in) { return linear_scale_residual(in[0], in[1], in[2], in[3], in[4]); },
                   [=](const auto& in) {
                     const Tensor y = ref_linear(in[1], in[2], &in[3]);
                     return channel_ref(&in[0], y, in[4]);
                   }});
  // mlp_scale_residual (Note [The MLP on one tile]): residual, x, w1, b1, w2, b2, gamma.
  cases.push_back(
      {"mlp_scale_residual",
       [](DType t, uint64_t s) {
         return std::vector{input({3, 5, 7}, t, s),   input({3, 5, 7}, t, s + 1, true, -2, 2),
                            input({26, 7}, t, s + 2), input({26}, t, s + 3),
                            input({7, 26}, t, s + 4), input({7}, t, s + 5),
                            input({7}, t, s + 6)};
       },
       [](const auto& in) { return mlp_scale_residual(in[0], in[1], in[2], in[3], in[4], in[5], in[6]); },
       [=](const auto& in) {
         const Tensor a = ref_gelu(ref_linear(in[1], in[2], &in[3]));
         return channel_ref(&in[0], ref_linear(a, in[4], &in[5]), in[6]);
       }});
  cases.push_back({"mlp_scale_residual_no_bias",
                   [](DType t, uint64_t s) {
                     return std::vector{input({9, 5}, t, s), input({9, 5}, t, s + 1, true, -2, 2),
                                        input({17, 5}, t, s + 2), input({5, 17}, t, s + 3),
                                        input({5}, t, s + 4)};
                   },
                   [](const auto& in) {
                     return mlp_scale_residual(in[0], in[1], in[2], Tensor(), in[3], Tensor(), in[4]);
                   },
                   [=](const auto& in) {
                     const Tensor a = ref_gelu(ref_linear(in[1], in[2], nullptr));
                     return channel_ref(&in[0], ref_linear(a, in[3], nullptr), in[4]);
                   }});
  cases.push_back({"sum", [=](DType t, uint64_t s) { return std::vector{input(nhwc, t, s)}; },
                   [](const auto& in) { return sum(in[0]); },
                   [](const auto& in) {
                     double acc = 0;
                     for (double v : host(in[0])) acc += v;
                     return make({acc}, {});
                   }});
  cases.push_back({"mean", [=](DType t, uint64_t s) { return std::vector{input(nhwc, t, s)}; },
                   [](const auto& in) { return mean(in[0]); },
                   [](const auto& in) {
                     double acc = 0;
                     const auto v = host(in[0]);
                     for (double x : v) acc += x;
                     return make({acc / double(v.size())}, {});
                   }});

  add_convnext_cases(cases);
  return cases;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = build();
  return cases;
}

}  // namespace cz::testing
