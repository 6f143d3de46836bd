// Global average pooling: validation, dispatch and backward rule.
#include "tensor/ops/pool.h"

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

class GlobalAvgPoolBackward final : public Node {
 public:
  explicit GlobalAvgPoolBackward(Shape x_sizes) : x_sizes_(std::move(x_sizes)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor gy = g[0].contiguous();
    Tensor dx = empty(x_sizes_, gy.dtype(), gy.device());
    if (gy.is_cpu())
      cpu::global_avg_pool_backward(gy, dx);
    else
      CZ_CUDA_CALL(cuda::global_avg_pool_backward(gy, dx, ops::stream_of(gy)));
    return {dx};
  }
  std::string name() const override { return "GlobalAvgPoolBackward"; }

 private:
  Shape x_sizes_;
};

}  // namespace

Tensor global_avg_pool(const Tensor& x) {
  ops::check_floating("global_avg_pool", "x", x);
  profiler::Scope prof("global_avg_pool", x.device());
  ops::check_cpu_compute_dtype("global_avg_pool", x);
  ops::check_dim("global_avg_pool", "x", x, 4, "NHWC (N, H, W, C)");
  CZ_CHECK_SHAPE(x.size(1) * x.size(2) > 0, "global_avg_pool: x has no pixels to average, shape {}",
                 shape_str(x.sizes()));
  const Tensor xc = x.contiguous();
  Tensor out = empty({x.size(0), x.size(3)}, x.dtype(), x.device());
  if (x.is_cpu())
    cpu::global_avg_pool_forward(xc, out);
  else
    CZ_CUDA_CALL(cuda::global_avg_pool_forward(xc, out, ops::stream_of(x)));
  if (should_record({&x})) record(std::make_shared<GlobalAvgPoolBackward>(x.sizes()), {&x}, {&out});
  return out;
}

}  // namespace cz
