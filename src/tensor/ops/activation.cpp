// GELU: validation, dispatch and backward rule.
#include "tensor/ops/activation.h"

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

class GeluBackward final : public Node {
 public:
  explicit GeluBackward(const Tensor& x) : x_(x) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor x = x_.get(), gy = g[0].contiguous();
    Tensor dx = empty_like(x);
    if (x.is_cpu())
      cpu::gelu_backward(gy, x, dx);
    else
      CZ_CUDA_CALL(cuda::gelu_backward(gy, x, dx, ops::stream_of(x)));
    return {dx};
  }
  std::string name() const override { return "GeluBackward"; }
  void release_saved() override { x_.reset(); }

 private:
  SavedTensor x_;
};

}  // namespace

Tensor gelu(const Tensor& x) {
  ops::check_floating("gelu", "x", x);
  profiler::Scope prof("gelu", x.device());
  ops::check_cpu_compute_dtype("gelu", x);
  const Tensor xc = x.contiguous();
  Tensor out = empty_like(x);
  if (x.is_cpu())
    cpu::gelu_forward(xc, out);
  else
    CZ_CUDA_CALL(cuda::gelu_forward(xc, out, ops::stream_of(x)));
  if (should_record({&x})) record(std::make_shared<GeluBackward>(xc), {&x}, {&out});
  return out;
}

}  // namespace cz
