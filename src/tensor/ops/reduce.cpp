// Full reductions: validation, dispatch and backward rules.
#include "tensor/ops/reduce.h"

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

class SumBackward final : public Node {
 public:
  SumBackward(Shape sizes, double factor) : sizes_(std::move(sizes)), factor_(factor) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    // Broadcast the scalar gradient (times 1/n for mean) without a host round trip.
    Tensor out = empty(sizes_, g[0].dtype(), g[0].device());
    if (out.is_cpu())
      cpu::broadcast_scalar(g[0], factor_, out);
    else
      CZ_CUDA_CALL(cuda::broadcast_scalar(g[0], factor_, out, ops::stream_of(out)));
    return {out};
  }
  std::string name() const override { return factor_ == 1.0 ? "SumBackward" : "MeanBackward"; }

 private:
  Shape sizes_;
  double factor_;
};

Tensor reduce(const char* op, const Tensor& x, double factor) {
  ops::check_floating(op, "x", x);
  profiler::Scope prof(op, x.device());
  ops::check_cpu_compute_dtype(op, x);
  const Tensor xc = x.contiguous();
  Tensor out = empty({}, x.dtype(), x.device());
  if (x.is_cpu())
    cpu::sum(xc, factor, out);
  else
    CZ_CUDA_CALL(cuda::sum(xc, factor, out, ops::stream_of(x)));
  if (should_record({&x})) record(std::make_shared<SumBackward>(x.sizes(), factor), {&x}, {&out});
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) {
  return reduce("sum", x, 1.0);
}
Tensor mean(const Tensor& x) {
  CZ_CHECK_SHAPE(x.numel() > 0, "mean: empty tensor of shape {}", shape_str(x.sizes()));
  return reduce("mean", x, 1.0 / double(x.numel()));
}

}  // namespace cz
