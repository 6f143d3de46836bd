// The fused MLP ops (Note [Fused epilogues on the CPU], Note [The MLP on one tile]) against the unfused ops
// they replace: outputs and every gradient, at ConvNeXt's MLP shapes and odd ones; the CPU kernels with
// forced tile sizes and thread counts (several tiles per thread, ragged last tiles, the split-rows weight
// gradient) in f64 to rounding.
#include <gtest/gtest.h>
#include <omp.h>

#include "common/gradcheck.h"
#include "tensor/autograd/engine.h"
#include "tensor/cpu/kernels.h"
#include "tensor/ops.h"

namespace cz::testing {
namespace {

struct Mlp {
  int64_t rows, c;
};

// ConvNeXt-atto's stages at 64 px (batch 16, 4, 1 and a partial one), a ConvNeXt-T stage-1 slice, odd shapes.
const std::vector<Mlp> kShapes = {{4096, 40}, {1024, 80}, {64, 160}, {20, 320}, {392, 96},
                                  {131, 13},  {37, 5},    {1, 3},    {257, 1}};

std::vector<Tensor> leaves(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) {
    Tensor l = t.detach().clone();
    l.set_requires_grad(true);
    out.push_back(l);
  }
  return out;
}

// The op's output, then the gradients of sum(out * probe) for each input.
std::vector<Tensor> run(const TensorFn& fn, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> in = leaves(inputs);
  Tensor y = fn(in);
  const Tensor probe = random_tensor(y.sizes(), 99, y.dtype());
  y.backward(probe);
  std::vector<Tensor> out{y.detach()};
  for (const Tensor& t : in) out.push_back(t.grad());
  return out;
}

void expect_equal(const std::vector<Tensor>& fused, const std::vector<Tensor>& unfused, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(fused.size(), unfused.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_TRUE(fused[i].defined() && unfused[i].defined()) << what << " output/gradient " << i;
    const double scale = i == 0 ? 1.0 : 10.0;  // gradients: the op table's 10x (F32GradientsMatchF64)
    EXPECT_TRUE(all_close(fused[i], unfused[i], scale * rtol, scale * atol))
        << what << " output/gradient " << i;
  }
}

std::vector<Tensor> fc1_inputs(const Mlp& s, DType t, uint64_t seed) {
  return {random_tensor({s.rows, s.c}, seed, t, -2, 2), random_tensor({4 * s.c, s.c}, seed + 1, t, -0.5, 0.5),
          random_tensor({4 * s.c}, seed + 2, t)};
}
std::vector<Tensor> fc2_inputs(const Mlp& s, DType t, uint64_t seed) {
  return {random_tensor({s.rows, s.c}, seed, t), random_tensor({s.rows, 4 * s.c}, seed + 1, t),
          random_tensor({s.c, 4 * s.c}, seed + 2, t, -0.2, 0.2), random_tensor({s.c}, seed + 3, t),
          random_tensor({s.c}, seed + 4, t)};
}

TensorFn fc1_fused = [](const std::vector<Tensor>& in) { return linear_gelu(in[0], in[1], in[2]); };
TensorFn fc1_unfused = [](const std::vector<Tensor>& in) { return gelu(linear(in[0], in[1], in[2])); };
TensorFn fc2_fused = [](const std::vector<Tensor>& in) {
  return linear_scale_residual(in[0], in[1], in[2], in[3], in[4]);
};
TensorFn fc2_unfused = [](const std::vector<Tensor>& in) {
  return residual_scale_add(in[0], linear(in[1], in[2], in[3]), in[4]);
};

TEST(LinearFused, F32MatchesUnfusedAtConvNeXtAndOddShapes) {
  for (const Mlp& s : kShapes) {
    const std::string at = "rows " + std::to_string(s.rows) + ", C " + std::to_string(s.c);
    const auto in1 = fc1_inputs(s, DType::f32, 5);
    expect_equal(run(fc1_fused, in1), run(fc1_unfused, in1), 1e-5, 1e-5, "linear_gelu at " + at);
    const auto in2 = fc2_inputs(s, DType::f32, 7);
    expect_equal(run(fc2_fused, in2), run(fc2_unfused, in2), 1e-5, 1e-5, "linear_scale_residual at " + at);
  }
}

// The kernels with the tile and thread count forced: every way of cutting the rows gives the unfused result.
TEST(LinearFused, TilesAndThreadsDoNotChangeTheResult) {
  const int threads = omp_get_max_threads();
  for (int nt : {1, 3}) {
    omp_set_num_threads(nt);
    for (const Mlp& s : {Mlp{131, 13}, Mlp{2600, 8}}) {  // the second takes the split-rows weight gradient
      const auto in1 = fc1_inputs(s, DType::f64, 21);
      const auto in2 = fc2_inputs(s, DType::f64, 23);
      const auto ref1 = run(fc1_unfused, in1), ref2 = run(fc2_unfused, in2);
      const Tensor probe1 = random_tensor(ref1[0].sizes(), 99, DType::f64);
      const Tensor probe2 = random_tensor(ref2[0].sizes(), 99, DType::f64);
      for (int64_t tile : {int64_t(1), int64_t(7), int64_t(16), s.rows}) {
        const std::string at = "rows " + std::to_string(s.rows) + ", tile " + std::to_string(tile) + ", " +
                               std::to_string(nt) + " threads";
        const Tensor &x = in1[0], &w = in1[1], &b = in1[2];
        Tensor h = empty({s.rows, 4 * s.c}, DType::f64), y = empty_like(h);
        cpu::linear_gelu_forward(x, w, b, h, y, tile);
        Tensor gh = empty_like(h), dx = empty_like(x), dw = empty_like(w), db = empty_like(b);
        cpu::linear_gelu_backward(probe1, x, h, w, gh, dx, dw, db, tile);
        expect_equal({y, dx, dw, db}, {ref1[0], ref1[1], ref1[2], ref1[3]}, 1e-12, 1e-12,
                     "linear_gelu, " + at);

        const Tensor &r = in2[0], &x2 = in2[1], &w2 = in2[2], &b2 = in2[3], &g2 = in2[4];
        Tensor y2 = empty({s.rows, s.c}, DType::f64), out = empty_like(y2);
        cpu::linear_scale_residual_forward(x2, w2, b2, g2, r, y2, out, tile);
        Tensor gb = empty_like(y2), dx2 = empty_like(x2), dw2 = empty_like(w2), db2 = empty_like(b2),
               dg2 = empty_like(g2);
        cpu::linear_scale_residual_backward(probe2, x2, y2, w2, g2, gb, dx2, dw2, db2, dg2, tile);
        expect_equal({out, probe2, dx2, dw2, db2, dg2}, ref2, 1e-12, 1e-12, "linear_scale_residual, " + at);
      }
    }
  }
  omp_set_num_threads(threads);
}

TEST(LinearFused, OnlyTheGradientsAskedForAreComputed) {
  const Mlp s{64, 40};
  auto in = fc2_inputs(s, DType::f32, 3);
  Tensor x = in[1].detach(), w = in[2].detach();
  w.set_requires_grad(true);  // only the weight: residual, x, bias and gamma are constants
  sum(linear_scale_residual(in[0], x, w, in[3], in[4])).backward();
  EXPECT_TRUE(w.grad().defined());
  Tensor g = in[4].detach();
  g.set_requires_grad(true);  // only gamma: no branch gradient at all
  sum(linear_scale_residual(in[0], x, in[2], in[3], g)).backward();
  const auto y = linear(x, in[2], in[3]).to_vector<double>();
  std::vector<double> ref(size_t(s.c), 0.0);
  for (size_t i = 0; i < y.size(); ++i) ref[i % size_t(s.c)] += y[i];
  EXPECT_TRUE(all_close(g.grad(), from_vector(ref, {s.c}), 1e-4, 1e-4));
}

// mlp_scale_residual (Note [The MLP on one tile]): residual, x, w1, b1, w2, b2, gamma.
std::vector<Tensor> mlp_inputs(const Mlp& s, DType t, uint64_t seed) {
  return {random_tensor({s.rows, s.c}, seed, t),
          random_tensor({s.rows, s.c}, seed + 1, t, -2, 2),
          random_tensor({4 * s.c, s.c}, seed + 2, t, -0.5, 0.5),
          random_tensor({4 * s.c}, seed + 3, t),
          random_tensor({s.c, 4 * s.c}, seed + 4, t, -0.2, 0.2),
          random_tensor({s.c}, seed + 5, t),
          random_tensor({s.c}, seed + 6, t)};
}
TensorFn mlp_one_op = [](const std::vector<Tensor>& in) {
  return mlp_scale_residual(in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
};
TensorFn mlp_two_ops = [](const std::vector<Tensor>& in) {
  return linear_scale_residual(in[0], linear_gelu(in[1], in[2], in[3]), in[4], in[5], in[6]);
};
TensorFn mlp_unfused = [](const std::vector<Tensor>& in) {
  return residual_scale_add(in[0], linear(gelu(linear(in[1], in[2], in[3])), in[4], in[5]), in[6]);
};

TEST(MlpOneOp, F32MatchesTheTwoFusedOpsAndTheUnfusedOnes) {
  for (const Mlp& s : kShapes) {
    const std::string at = "rows " + std::to_string(s.rows) + ", C " + std::to_string(s.c);
    const auto in = mlp_inputs(s, DType::f32, 11);
    const auto one = run(mlp_one_op, in);
    expect_equal(one, run(mlp_two_ops, in), 1e-5, 1e-5, "mlp_scale_residual vs the fused ops at " + at);
    // Two GEMMs in a row (k up to 4C = 1280) summed in another order: f32 rounding of a few 1e-5.
    expect_equal(one, run(mlp_unfused, in), 1e-4, 1e-4, "mlp_scale_residual vs unfused at " + at);
  }
}

// The kernels with the tile and thread count forced, in f64: every way of cutting the rows (several tiles per
// thread, ragged last tiles, one row per tile) gives the unfused result to rounding; and the forward without
// the saved tensors (no graph recorded) gives the same output.
TEST(MlpOneOp, TilesAndThreadsDoNotChangeTheResult) {
  const int threads = omp_get_max_threads();
  for (int nt : {1, 3}) {
    omp_set_num_threads(nt);
    for (const Mlp& s : {Mlp{131, 13}, Mlp{2600, 8}}) {
      const auto in = mlp_inputs(s, DType::f64, 31);
      const auto ref = run(mlp_unfused, in);
      const Tensor probe = random_tensor(ref[0].sizes(), 99, DType::f64);
      const Tensor &r = in[0], &x = in[1], &w1 = in[2], &b1 = in[3], &w2 = in[4], &b2 = in[5], &g = in[6];
      for (int64_t tile : {int64_t(1), int64_t(7), int64_t(16), s.rows}) {
        const std::string at = "rows " + std::to_string(s.rows) + ", tile " + std::to_string(tile) + ", " +
                               std::to_string(nt) + " threads";
        Tensor h = empty({s.rows, 4 * s.c}, DType::f64), y2 = empty({s.rows, s.c}, DType::f64);
        Tensor out = empty({s.rows, s.c}, DType::f64), out_eval = empty_like(out), none;
        cpu::mlp_scale_residual_forward(x, w1, b1, w2, b2, g, r, h, y2, out, tile);
        cpu::mlp_scale_residual_forward(x, w1, b1, w2, b2, g, r, none, none, out_eval, tile);
        EXPECT_TRUE(all_close(out_eval, out, 0, 0)) << "without the saved tensors, " << at;
        Tensor dx = empty_like(x), dw1 = empty_like(w1), db1 = empty_like(b1), dw2 = empty_like(w2),
               db2 = empty_like(b2), dg = empty_like(g);
        cpu::mlp_scale_residual_backward(probe, x, h, y2, w1, w2, g, dx, dw1, db1, dw2, db2, dg, tile);
        expect_equal({out, probe, dx, dw1, db1, dw2, db2, dg}, ref, 1e-12, 1e-12,
                     "mlp_scale_residual, " + at);
      }
    }
  }
  omp_set_num_threads(threads);
}

TEST(MlpOneOp, OnlyTheGradientsAskedForAreComputed) {
  const Mlp s{64, 40};
  const auto in = mlp_inputs(s, DType::f32, 3);
  Tensor w2 = in[4].detach();
  w2.set_requires_grad(true);  // only fc2's weight
  sum(mlp_scale_residual(in[0], in[1], in[2], in[3], w2, in[5], in[6])).backward();
  Tensor w2_ref = in[4].detach();
  w2_ref.set_requires_grad(true);
  sum(mlp_unfused({in[0], in[1], in[2], in[3], w2_ref, in[5], in[6]})).backward();
  EXPECT_TRUE(all_close(w2.grad(), w2_ref.grad(), 1e-4, 1e-4));
  Tensor g = in[6].detach();
  g.set_requires_grad(true);  // only gamma
  sum(mlp_scale_residual(in[0], in[1], in[2], in[3], in[4], in[5], g)).backward();
  Tensor g_ref = in[6].detach();
  g_ref.set_requires_grad(true);
  sum(mlp_unfused({in[0], in[1], in[2], in[3], in[4], in[5], g_ref})).backward();
  EXPECT_TRUE(all_close(g.grad(), g_ref.grad(), 1e-4, 1e-4));
}

TEST(MlpOneOp, TheBlockUsesItWhereTheWeightsAreSmallOnTheCpu) {
  EXPECT_TRUE(mlp_as_one_op(false, 40, 160));    // atto's first stage
  EXPECT_TRUE(mlp_as_one_op(false, 96, 384));    // ConvNeXt-T's first stage
  EXPECT_FALSE(mlp_as_one_op(false, 160, 640));  // atto's third
  EXPECT_FALSE(mlp_as_one_op(true, 40, 160));    // CUDA keeps the two fused ops
}

TEST(LinearFused, BadShapesNameTheProblem) {
  const Tensor x = zeros({4, 8}), w = zeros({3, 8}), b = zeros({3}), g = zeros({3});
  EXPECT_THROW(
      {
        try {
          linear_scale_residual(zeros({4, 4}), x, w, b, g);
        } catch (const ShapeError& e) {
          EXPECT_NE(std::string(e.what()).find("residual has shape (4, 4)"), std::string::npos) << e.what();
          throw;
        }
      },
      ShapeError);
  EXPECT_THROW(linear_scale_residual(zeros({4, 3}), x, w, b, zeros({4})), ShapeError);
  EXPECT_THROW(linear_gelu(zeros({4, 7}), w, b), ShapeError);
  // mlp_scale_residual: x (4, 8), w1 (3, 8), so w2 must be (8, 3).
  EXPECT_THROW(
      {
        try {
          mlp_scale_residual(zeros({4, 8}), x, w, b, zeros({8, 4}), zeros({8}), zeros({8}));
        } catch (const ShapeError& e) {
          EXPECT_NE(std::string(e.what()).find("w2 has shape (8, 4), expected (8, 3)"), std::string::npos)
              << e.what();
          throw;
        }
      },
      ShapeError);
  EXPECT_THROW(mlp_scale_residual(zeros({4, 8}), x, w, b, zeros({8, 3}), zeros({8}), zeros({3})), ShapeError);
  EXPECT_THROW(mlp_scale_residual(zeros({4, 3}), x, w, b, zeros({8, 3}), zeros({8}), zeros({8})), ShapeError);
}

}  // namespace
}  // namespace cz::testing
