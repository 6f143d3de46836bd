// The optimizer's CUDA kernels against its CPU kernels: AdamW and SGD over pieces with gaps and more pieces
// than one launch carries (f32: same bits expected, same formula and rounding), the sum of squares, loss
// unscaling with the non-finite flag, and the EMA. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/gradcheck.h"
#include "optim/cpu_kernels.h"
#include "optim/cuda_kernels.h"
#include "tensor/device.h"
#include "tensor/stream.h"

namespace cz::testing {
namespace {

#define CZ_REQUIRE_GPU()                                                   \
  do {                                                                     \
    if (!::cz::cuda_available()) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

Device gpu() {
  return Device::cuda(0);
}

// 100 pieces with varying hyper-parameters and gaps between some of them (left untouched by both backends).
std::vector<ShardPiece> many_pieces(int64_t n) {
  std::vector<ShardPiece> pieces;
  const int64_t step = n / 100;
  for (int i = 0; i < 100; ++i) {
    const int64_t b = i * step, e = i % 7 == 3 ? b + step / 2 : (i == 99 ? n : b + step);
    pieces.push_back({b, e, i % 3 == 0 ? 0.0 : 0.05, i % 5 == 0 ? 0.5 : 1.0});
  }
  return pieces;
}

void expect_same(const Tensor& gpu_t, const Tensor& cpu_t, double tol, const char* what) {
  EXPECT_TRUE(all_close(gpu_t.to(Device::cpu()), cpu_t, tol, tol)) << what;
}

TEST(CudaOptim, AdamWMatchesCpuOverManyPieces) {
  CZ_REQUIRE_GPU();
  for (DType t : {DType::f32, DType::f64}) {
    const int64_t n = 100003;
    Tensor p = random_tensor({n}, 1, t), g = random_tensor({n}, 2, t, -0.1, 0.1);
    Tensor m = random_tensor({n}, 3, t, -0.01, 0.01), v = random_tensor({n}, 4, t, 0.0, 0.01);
    Tensor pg = p.to(gpu()), gg = g.to(gpu()), mg = m.to(gpu()), vg = v.to(gpu());
    const auto pieces = many_pieces(n);
    for (int64_t step = 1; step <= 3; ++step) {
      const AdamWStepArgs args{1e-3, 0.9, 0.999, 1e-8, step};
      cpu::adamw_step(p, g, m, v, pieces, args);
      cuda::adamw_step(pg, gg, mg, vg, pieces, args, current_stream(gpu()));
    }
    expect_same(pg, p, 0, "p");
    expect_same(mg, m, 0, "exp_avg");
    expect_same(vg, v, 0, "exp_avg_sq");
  }
}

TEST(CudaOptim, SgdMatchesCpuInEveryMode) {
  CZ_REQUIRE_GPU();
  const int64_t n = 50001;
  const auto pieces = many_pieces(n);
  for (double momentum : {0.0, 0.9})
    for (bool nesterov : {false, true}) {
      if (nesterov && momentum == 0) continue;
      Tensor p = random_tensor({n}, 5, DType::f32), g = random_tensor({n}, 6, DType::f32, -0.1, 0.1);
      Tensor buf = zeros({n}, DType::f32);
      Tensor pg = p.to(gpu()), gg = g.to(gpu()), bg = buf.to(gpu());
      for (int s = 0; s < 3; ++s) {
        const SgdStepArgs args{0.1, momentum, 0.1, nesterov, s == 0};
        cpu::sgd_step(p, g, buf, pieces, args);
        cuda::sgd_step(pg, gg, bg, pieces, args, current_stream(gpu()));
      }
      expect_same(pg, p, 0, "p");
      expect_same(bg, buf, 0, "momentum buffer");
    }
}

// The kernels find an element's piece by binary search: unsorted or overlapping pieces are refused on the
// host rather than updating elements with another piece's constants. Empty pieces are skipped wherever they
// are.
TEST(CudaOptim, RefusesUnsortedOrOverlappingPieces) {
  CZ_REQUIRE_GPU();
  const int64_t n = 100;
  Tensor p = zeros({n}, DType::f32, gpu()), g = zeros({n}, DType::f32, gpu());
  Tensor m = zeros({n}, DType::f32, gpu()), v = zeros({n}, DType::f32, gpu());
  const AdamWStepArgs args{1e-3, 0.9, 0.999, 1e-8, 1};
  const std::vector<ShardPiece> unsorted = {{50, 100, 0.0, 1.0}, {0, 50, 0.0, 1.0}};
  const std::vector<ShardPiece> overlapping = {{0, 60, 0.0, 1.0}, {50, 100, 0.0, 1.0}};
  const std::vector<ShardPiece> with_empty = {{0, 50, 0.0, 1.0}, {10, 10, 0.0, 1.0}, {50, 100, 0.0, 1.0}};
  const Stream s = current_stream(gpu());
  EXPECT_THROW(cuda::adamw_step(p, g, m, v, unsorted, args, s), ShapeError);
  EXPECT_THROW(cuda::adamw_step(p, g, m, v, overlapping, args, s), ShapeError);
  EXPECT_NO_THROW(cuda::adamw_step(p, g, m, v, with_empty, args, s));
  Tensor no_buffer;
  EXPECT_THROW(cuda::sgd_step(p, g, no_buffer, unsorted, SgdStepArgs{0.1}, s), ShapeError);
}

TEST(CudaOptim, SqNormUnscaleAndEma) {
  CZ_REQUIRE_GPU();
  const Tensor x = random_tensor({1 << 20}, 7, DType::f32);
  Tensor out_c = zeros({}, DType::f64), out_g = zeros({}, DType::f64, gpu());
  cpu::sq_norm(x, out_c);
  cuda::sq_norm(x.to(gpu()), out_g, current_stream(gpu()));
  EXPECT_NEAR(out_g.item(), out_c.item(), 1e-12 * out_c.item());

  Tensor y = random_tensor({1000}, 8, DType::f32), yg = y.to(gpu());
  Tensor found_c = zeros({}, DType::f32), found_g = zeros({}, DType::f32, gpu());
  cpu::unscale_and_check(y, 0.5, found_c);
  cuda::unscale_and_check(yg, 0.5, found_g, current_stream(gpu()));
  expect_same(yg, y, 0, "unscaled");
  EXPECT_EQ(found_g.item(), 0.0);
  yg.narrow(0, 517, 1).fill_(std::numeric_limits<double>::infinity());
  cuda::unscale_and_check(yg, 1.0, found_g, current_stream(gpu()));
  EXPECT_EQ(found_g.item(), 1.0);

  Tensor e = random_tensor({777}, 9, DType::f32), q = random_tensor({777}, 10, DType::f32), eg = e.to(gpu());
  cpu::ema_update(e, q, 0.999);
  cuda::ema_update(eg, q.to(gpu()), 0.999, current_stream(gpu()));
  expect_same(eg, e, 0, "ema");
}

}  // namespace
}  // namespace cz::testing
