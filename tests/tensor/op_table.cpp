// The op table: inputs, the op, and a naive reference for every differentiable op.
#include "op_table.h"

#include <cmath>

#include "tensor/ops.h"

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
  return cases;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = build();
  return cases;
}

}  // namespace cz::testing
