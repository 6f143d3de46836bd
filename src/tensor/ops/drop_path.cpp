// Drop path (stochastic depth): the per-sample mask is drawn on the host from the Generator, so every device
// and thread count sees the same mask for the same generator state.
#include "tensor/ops/drop_path.h"

#include <cmath>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops/common.h"

namespace cz {
namespace {

Tensor apply_scale(const Tensor& x, const Tensor& scale) {
  Tensor out = empty_like(x);
  if (x.is_cpu())
    cpu::sample_scale(x, scale, out);
  else
    CZ_CUDA_CALL(cuda::sample_scale(x, scale, out, ops::stream_of(x)));
  return out;
}

class DropPathBackward final : public Node {
 public:
  explicit DropPathBackward(const Tensor& scale) : scale_(scale) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {apply_scale(g[0].contiguous(), scale_)};
  }
  std::string name() const override { return "DropPathBackward"; }

 private:
  Tensor scale_;  // the op's own mask, never written in place
};

}  // namespace

Tensor drop_path(const Tensor& x, double p, Generator& gen) {
  ops::check_floating("drop_path", "x", x);
  profiler::Scope prof("drop_path", x.device());
  ops::check_cpu_compute_dtype("drop_path", x);
  CZ_CHECK(p >= 0 && p < 1, "drop_path: p must be in [0, 1), got {}", p);
  CZ_CHECK_SHAPE(x.dim() >= 1, "drop_path: x must have a sample dimension, got shape {}",
                 shape_str(x.sizes()));
  if (p == 0) return x;
  // A sample is kept when its uniform draw u satisfies u >= p (probability 1 - p), as timm's
  // floor(1 - p + u). Sample n draws from Philox block (first + n) alone, so a generator positioned at a
  // sample's global index gives it the same mask whichever batch slice it arrives in (Note [Drop-path
  // masks]).
  const int64_t N = x.size(0);
  const uint64_t first = gen.reserve(uint64_t(N));
  std::vector<double> mask(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const auto r = philox4x32(gen.seed(), first + uint64_t(n));
    const double u = double((uint64_t(r[0]) << 21) ^ r[1]) * 0x1p-53;
    mask[size_t(n)] = u >= p ? 1.0 / (1.0 - p) : 0.0;
  }
  const Tensor scale = from_vector(mask, {N}).to(x.dtype()).to(x.device());
  Tensor out = apply_scale(x.contiguous(), scale);
  if (should_record({&x})) record(std::make_shared<DropPathBackward>(scale), {&x}, {&out});
  return out;
}

}  // namespace cz
