// Finite-difference gradient checking and closeness assertions.
#include "common/gradcheck.h"

#include <cmath>
#include <random>

#include "tensor/autograd/engine.h"
#include "tensor/random.h"

namespace cz::testing {

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype, double lo, double hi) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 17);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) {
    do x = dist(rng);
    while (x == 0.0);
  }
  return from_vector(v, shape).to(dtype);
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(actual.sizes()) << " vs expected " << shape_str(expected.sizes());
  const auto a = actual.to_vector<double>();
  const auto b = expected.to_vector<double>();
  double worst = -1;
  size_t worst_i = 0;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(a[i] - b[i]);
    const double tol = atol + rtol * std::abs(b[i]);
    if (!(err <= tol)) {  // NaN fails
      ++bad;
      if (std::isnan(err) || err - tol > worst) {
        worst = std::isnan(err) ? INFINITY : err - tol;
        worst_i = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << a.size() << " elements differ; worst at " << worst_i << ": " << a[worst_i]
         << " vs expected " << b[worst_i] << " (rtol " << rtol << ", atol " << atol << ")";
}

namespace {
double dot(const Tensor& y, const std::vector<double>& w) {
  const auto v = y.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}
}  // namespace

::testing::AssertionResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, double eps,
                                     double atol, double rtol) {
  std::vector<Tensor> xs;
  for (const Tensor& in : inputs) {
    Tensor x = in.detach().clone();
    if (in.requires_grad()) x.set_requires_grad(true);
    xs.push_back(x);
  }
  Tensor y = fn(xs);
  Tensor w = random_tensor(y.sizes(), 4242, y.dtype());
  const auto wv = w.to_vector<double>();
  y.backward(w);

  for (size_t k = 0; k < xs.size(); ++k) {
    if (!xs[k].requires_grad()) continue;
    Tensor analytic = xs[k].grad();
    if (!analytic.defined()) analytic = zeros_like(xs[k]);
    const auto an = analytic.to_vector<double>();
    // Perturb a private copy element by element.
    Tensor base = xs[k].detach().contiguous().to(DType::f64).clone();
    std::vector<double> numeric(static_cast<size_t>(base.numel()));
    double* p = base.data<double>();
    for (int64_t i = 0; i < base.numel(); ++i) {
      const double orig = p[i];
      std::vector<Tensor> args;
      NoGradGuard no_grad;
      auto eval = [&](double v) {
        p[i] = v;
        std::vector<Tensor> a = xs;
        a[k] = base.to(xs[k].dtype()).clone();
        return dot(fn(a), wv);
      };
      const double plus = eval(orig + eps), minus = eval(orig - eps);
      p[i] = orig;
      numeric[size_t(i)] = (plus - minus) / (2 * eps);
    }
    for (size_t i = 0; i < numeric.size(); ++i) {
      const double err = std::abs(an[i] - numeric[i]);
      if (!(err <= atol + rtol * std::abs(numeric[i])))
        return ::testing::AssertionFailure() << "input " << k << " element " << i << ": analytic " << an[i]
                                             << " vs numeric " << numeric[i] << " (|diff| " << err << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<Tensor> output_and_grads(const TensorFn& fn, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> xs;
  for (const Tensor& t : inputs) {
    Tensor x = t.detach().clone();
    if (is_floating(x.dtype())) x.set_requires_grad(true);
    xs.push_back(x);
  }
  Tensor y = fn(xs);
  y.backward(random_tensor(y.sizes(), 99, y.dtype()));
  std::vector<Tensor> out{y.detach()};
  for (const Tensor& x : xs)
    if (x.requires_grad()) out.push_back(x.grad().defined() ? x.grad() : zeros_like(x));
  return out;
}

}  // namespace cz::testing
