// Cross-entropy (hard and soft targets), argmax and accuracy counting: validation, dispatch and the
// cross-entropies' backward rules.
#include "tensor/ops/loss.h"

#include <cmath>

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

class CrossEntropyBackward final : public Node {
 public:
  CrossEntropyBackward(const Tensor& logits, const Tensor& labels, const Tensor& lse, double smoothing)
      : logits_(logits), labels_(labels), lse_(lse), smoothing_(smoothing) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor logits = logits_.get(), labels = labels_.get(), lse = lse_.get();
    const Tensor gloss = g[0].contiguous();
    Tensor dlogits = empty_like(logits);
    if (logits.is_cpu())
      cpu::cross_entropy_backward(gloss, logits, labels, lse, smoothing_, dlogits);
    else
      CZ_CUDA_CALL(cuda::cross_entropy_backward(gloss, logits, labels, lse, smoothing_, dlogits,
                                                ops::stream_of(logits)));
    return {dlogits, Tensor()};
  }
  std::string name() const override { return "CrossEntropyBackward"; }
  void release_saved() override {
    logits_.reset();
    labels_.reset();
    lse_.reset();
  }

 private:
  SavedTensor logits_, labels_, lse_;
  double smoothing_;
};

class SoftTargetCrossEntropyBackward final : public Node {
 public:
  SoftTargetCrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 const Tensor& tsum)
      : logits_(logits), targets_(targets), lse_(lse), tsum_(tsum) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor logits = logits_.get(), targets = targets_.get(), lse = lse_.get(), tsum = tsum_.get();
    const Tensor gloss = g[0].contiguous();
    Tensor dlogits = needs_input_grad(0) ? empty_like(logits) : Tensor();
    Tensor dtargets = needs_input_grad(1) ? empty_like(targets) : Tensor();
    if (logits.is_cpu())
      cpu::soft_target_cross_entropy_backward(gloss, logits, targets, lse, tsum, dlogits, dtargets);
    else
      CZ_CUDA_CALL(cuda::soft_target_cross_entropy_backward(gloss, logits, targets, lse, tsum, dlogits,
                                                            dtargets, ops::stream_of(logits)));
    return {dlogits, dtargets};
  }
  std::string name() const override { return "SoftTargetCrossEntropyBackward"; }
  void release_saved() override {
    logits_.reset();
    targets_.reset();
    lse_.reset();
    tsum_.reset();
  }

 private:
  SavedTensor logits_, targets_, lse_, tsum_;
};

// logits: (N, K) float, labels: (N) i32/i64 on the same device.
void check_logits_labels(const char* op, const Tensor& logits, const Tensor& labels) {
  ops::check_floating(op, "logits", logits);
  ops::check_cpu_compute_dtype(op, logits);
  ops::check_dim(op, "logits", logits, 2, "(N, K)");
  ops::check_defined(op, "labels", labels);
  CZ_CHECK_DTYPE(labels.dtype() == DType::i64 || labels.dtype() == DType::i32,
                 "{}: labels must be i64 or i32, got {}", op, dtype_name(labels.dtype()));
  CZ_CHECK_DEVICE(labels.device() == logits.device(), "{}: labels are on {} but logits are on {}", op,
                  labels.device().str(), logits.device().str());
  CZ_CHECK_SHAPE(labels.dim() == 1 && labels.size(0) == logits.size(0),
                 "{}: labels have shape {} but logits have shape {} (labels must be ({}))", op,
                 shape_str(labels.sizes()), shape_str(logits.sizes()), logits.size(0));
}

// Every label in [0, K). Host labels are checked here; the CUDA kernels check device labels themselves.
void check_label_range(const char* op, const Tensor& labels, int64_t K) {
  if (!labels.is_cpu()) return;
  const std::vector<int64_t> v = labels.to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); ++i)
    CZ_CHECK(v[i] >= 0 && v[i] < K, "{}: labels[{}] = {} is out of range for {} classes (logits {})", op, i,
             v[i], K, shape_str({int64_t(v.size()), K}));
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing) {
  check_logits_labels("cross_entropy", logits, labels);
  profiler::Scope prof("cross_entropy", logits.device());
  CZ_CHECK_SHAPE(logits.size(0) > 0 && logits.size(1) > 0,
                 "cross_entropy: logits must be non-empty, got shape {}", shape_str(logits.sizes()));
  CZ_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
           "cross_entropy: label_smoothing must be in [0, 1], got {}", label_smoothing);
  const Tensor zc = logits.contiguous().detach(), yc = labels.contiguous();
  check_label_range("cross_entropy", yc, logits.size(1));
  Tensor loss = empty({}, logits.dtype(), logits.device());
  // lse in the accumulation type (f32 for 16-bit logits on CUDA): backward's softmax exp(z - lse) would
  // otherwise carry lse's rounding error (|lse| 2^-8 in bf16) into every probability.
  const DType stat_t = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor lse = empty({logits.size(0)}, stat_t, logits.device());
  if (logits.is_cpu())
    cpu::cross_entropy_forward(zc, yc, label_smoothing, loss, lse);
  else
    CZ_CUDA_CALL(cuda::cross_entropy_forward(zc, yc, label_smoothing, loss, lse, ops::stream_of(logits)));
  if (should_record({&logits}))
    record(std::make_shared<CrossEntropyBackward>(zc, yc, lse, label_smoothing), {&logits, &labels}, {&loss});
  return loss;
}

Tensor soft_target_cross_entropy(const Tensor& logits, const Tensor& targets) {
  constexpr const char* op = "soft_target_cross_entropy";
  ops::check_floating(op, "logits", logits);
  ops::check_cpu_compute_dtype(op, logits);
  ops::check_dim(op, "logits", logits, 2, "(N, K)");
  profiler::Scope prof(op, logits.device());
  CZ_CHECK_SHAPE(logits.size(0) > 0 && logits.size(1) > 0, "{}: logits must be non-empty, got shape {}", op,
                 shape_str(logits.sizes()));
  ops::check_same_shape(op, "logits", logits, "targets", targets);
  const Tensor zc = logits.contiguous().detach(), tc = targets.contiguous().detach();
  Tensor loss = empty({}, logits.dtype(), logits.device());
  // Row statistics in the accumulation type, as cross_entropy's lse (f32 for 16-bit logits on CUDA).
  const DType stat_t = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor lse = empty({logits.size(0)}, stat_t, logits.device());
  Tensor tsum = empty({logits.size(0)}, stat_t, logits.device());
  if (logits.is_cpu())
    cpu::soft_target_cross_entropy_forward(zc, tc, loss, lse, tsum);
  else
    CZ_CUDA_CALL(cuda::soft_target_cross_entropy_forward(zc, tc, loss, lse, tsum, ops::stream_of(logits)));
  if (should_record({&logits, &targets}))
    record(std::make_shared<SoftTargetCrossEntropyBackward>(zc, tc, lse, tsum), {&logits, &targets}, {&loss});
  return loss;
}

Tensor argmax(const Tensor& x) {
  ops::check_floating("argmax", "x", x);
  profiler::Scope prof("argmax", x.device());
  ops::check_cpu_compute_dtype("argmax", x);
  CZ_CHECK_SHAPE(x.dim() >= 1 && x.size(-1) > 0,
                 "argmax: x must have a non-empty last dimension, got shape {}", shape_str(x.sizes()));
  Shape out_sizes(x.sizes().begin(), x.sizes().end() - 1);
  Tensor out = empty(out_sizes, DType::i64, x.device());
  const Tensor xc = x.contiguous();
  if (x.is_cpu())
    cpu::argmax(xc, out);
  else
    CZ_CUDA_CALL(cuda::argmax(xc, out, ops::stream_of(x)));
  return out;
}

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  check_logits_labels("count_correct", logits, labels);
  Tensor pred;
  {
    NoGradGuard no_grad;
    pred = argmax(logits.detach());
  }
  const std::vector<int64_t> p = pred.to_vector<int64_t>(), y = labels.to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < p.size(); ++i) correct += p[i] == y[i];
  return correct;
}

int64_t count_top_k(const Tensor& logits, const Tensor& labels, int64_t k) {
  check_logits_labels("count_top_k", logits, labels);
  const int64_t n = logits.size(0), classes = logits.size(1);
  CZ_CHECK(k >= 1 && k <= classes, "count_top_k: k must be in [1, {}] for logits {}, got {}", classes,
           shape_str(logits.sizes()), k);
  // On the host: an evaluation batch's logits are small beside its forward pass, and the count is read there.
  const std::vector<double> z = logits.detach().to(Device::cpu()).to(DType::f64).to_vector<double>();
  const std::vector<int64_t> y = labels.to_vector<int64_t>();
  // a ranks above b: NaN above every number; otherwise by value, and the lower index among equals.
  const auto above = [](double a, int64_t ia, double b, int64_t ib) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && (!std::isnan(b) || ia < ib);
    return a > b || (a == b && ia < ib);
  };
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = y[size_t(i)];
    CZ_CHECK(label >= 0 && label < classes, "count_top_k: labels[{}] = {} is out of range for {} classes", i,
             label, classes);
    const double* row = z.data() + i * classes;
    int64_t rank = 0;  // classes ranked above the label's
    for (int64_t j = 0; j < classes && rank < k; ++j) rank += above(row[j], j, row[label], label);
    correct += rank < k;
  }
  return correct;
}

}  // namespace cz
