// Microbenchmarks of the CPU kernels that dominate ConvNeXt training: the MLP's GEMMs, depthwise 7x7 conv,
// LayerNorm, GELU and the patchify convs, at ConvNeXt-T stage shapes (batch 8, 224px) and ConvNeXt-atto
// training shapes (batch 32, 64px). GEMM and conv report FLOP/s, LayerNorm and GELU bytes/s of compulsory
// traffic. bench/kernels_vs_torch.py times the same shapes in PyTorch and prints the ratios.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/ops/linear_fused.h"
#include "tensor/parallel.h"
#include "tensor/random.h"

namespace cz {
namespace {

Tensor uniform(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t = empty(shape);
  uniform_(t, -1.0, 1.0, gen);
  return t;
}

// FLOP/s or B/s from a per-iteration amount.
void rate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] = benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// Registers a benchmark timed in wall-clock time (the kernels run on several OpenMP threads).
template <class F>
void reg(const std::string& name, F&& f) {
  benchmark::RegisterBenchmark(name.c_str(), std::forward<F>(f))->UseRealTime();
}

std::string nhwc(int64_t n, int64_t hw, int64_t c) {
  return fmt::format("{}x{}x{}x{}", n, hw, hw, c);
}

void add_stage(int64_t n, int64_t hw, int64_t c) {
  const Shape x_shape{n, hw, hw, c}, h_shape{n, hw, hw, 4 * c};
  const double elems = double(n * hw * hw * c), m = double(n * hw * hw);
  const std::string s = nhwc(n, hw, c), s4 = nhwc(n, hw, 4 * c);

  // The block's MLP: pwconv1 (C -> 4C) and pwconv2 (4C -> C) as GEMMs over the N H W pixels.
  for (auto [in, out] : {std::pair{c, 4 * c}, std::pair{4 * c, c}}) {
    const std::string mkn = fmt::format("{}x{}x{}", int64_t(m), in, out);
    reg(("linear_fwd/" + mkn), [=](benchmark::State& st) {
      const Tensor x = uniform({int64_t(m), in}, 1), w = uniform({out, in}, 2), b = uniform({out}, 3);
      Tensor y = empty({int64_t(m), out});
      for (auto _ : st) cpu::linear_forward(x, w, b, y);
      rate(st, "FLOP/s", 2 * m * double(in * out));
    });
    reg(("linear_bwd/" + mkn), [=](benchmark::State& st) {
      const Tensor x = uniform({int64_t(m), in}, 1), w = uniform({out, in}, 2),
                   gy = uniform({int64_t(m), out}, 3);
      Tensor dx = empty({int64_t(m), in}), dw = empty({out, in}), db = empty({out});
      for (auto _ : st) cpu::linear_backward(gy, x, w, dx, dw, db);
      rate(st, "FLOP/s", 4 * m * double(in * out));
    });
  }

  reg(("dwconv7_fwd/" + s), [=](benchmark::State& st) {
    const Tensor x = uniform(x_shape, 1), w = uniform({7, 7, c}, 2), b = uniform({c}, 3);
    Tensor y = empty(x_shape);
    for (auto _ : st) cpu::depthwise_conv2d_forward(x, w, b, y);
    rate(st, "FLOP/s", 2 * 49 * elems);
  });
  reg(("dwconv7_bwd/" + s), [=](benchmark::State& st) {
    const Tensor x = uniform(x_shape, 1), w = uniform({7, 7, c}, 2), gy = uniform(x_shape, 3);
    Tensor dx = empty(x_shape), dw = empty({7, 7, c}), db = empty({c});
    for (auto _ : st) cpu::depthwise_conv2d_backward(gy, x, w, dx, dw, db);
    rate(st, "FLOP/s", 4 * 49 * elems);  // input and weight gradients
  });

  reg(("layer_norm_fwd/" + s), [=](benchmark::State& st) {
    const Tensor x = uniform({int64_t(m), c}, 1), w = uniform({c}, 2), b = uniform({c}, 3);
    Tensor y = empty({int64_t(m), c}), mean = empty({int64_t(m)}), rstd = empty({int64_t(m)});
    for (auto _ : st) cpu::layer_norm_forward(x, w, b, 1e-6, y, mean, rstd);
    rate(st, "B/s", 2 * 4 * elems);  // read x, write y
  });
  reg(("layer_norm_bwd/" + s), [=](benchmark::State& st) {
    const Tensor x = uniform({int64_t(m), c}, 1), w = uniform({c}, 2), b = uniform({c}, 3);
    Tensor y = empty({int64_t(m), c}), mean = empty({int64_t(m)}), rstd = empty({int64_t(m)});
    cpu::layer_norm_forward(x, w, b, 1e-6, y, mean, rstd);
    const Tensor gy = uniform({int64_t(m), c}, 4);
    Tensor dx = empty({int64_t(m), c}), dw = empty({c}), db = empty({c});
    for (auto _ : st) cpu::layer_norm_backward(gy, x, w, mean, rstd, dx, dw, db);
    rate(st, "B/s", 3 * 4 * elems);  // read x and gy, write dx
  });

  // GELU runs on the 4C-wide hidden activations.
  reg(("gelu_fwd/" + s4), [=](benchmark::State& st) {
    const Tensor x = uniform(h_shape, 1);
    Tensor y = empty(h_shape);
    for (auto _ : st) cpu::gelu_forward(x, y);
    rate(st, "B/s", 2 * 4 * 4 * elems);
  });
  reg(("gelu_bwd/" + s4), [=](benchmark::State& st) {
    const Tensor x = uniform(h_shape, 1), gy = uniform(h_shape, 2);
    Tensor dx = empty(h_shape);
    for (auto _ : st) cpu::gelu_backward(gy, x, dx);
    rate(st, "B/s", 3 * 4 * 4 * elems);
  });
}

// A block's MLP, forward and backward, as the model ran it before Note [Fused epilogues on the CPU] (fc1 with
// the bias filled first, GELU, fc2, residual_scale_add; then their backward kernels), fused (linear_gelu,
// linear_scale_residual and their backward kernels), and as one op (mlp_scale_residual, Note [The MLP on one
// tile], registered where the block would use it), all in the same run; `tile` 0 is the kernels' own choice
// (row_tile), others force that many rows per tile (the sweep behind row_tile's 1 MiB).
enum class Mlp { unfused, fused, one_op };

void add_block_mlp(int64_t n, int64_t hw, int64_t c, const std::vector<int64_t>& tiles) {
  const int64_t m = n * hw * hw;
  const double flops = 12 * double(m) * double(4 * c * c);  // fc1 and fc2, forward and backward
  auto body = [=](Mlp way, int64_t tile, bool backward = true) {
    return [=](benchmark::State& st) {
      const Tensor x = uniform({m, c}, 1), w1 = uniform({4 * c, c}, 2), b1 = uniform({4 * c}, 3);
      const Tensor w2 = uniform({c, 4 * c}, 4), b2 = uniform({c}, 5), gamma = uniform({c}, 6);
      const Tensor r = uniform({m, c}, 7), g = uniform({m, c}, 8);
      Tensor h = empty({m, 4 * c}), a = empty({m, 4 * c}), y = empty({m, c}), out = empty({m, c});
      Tensor gb = empty({m, c}), dgamma = empty({c}), da = empty({m, 4 * c}), dw2 = empty({c, 4 * c});
      Tensor db2 = empty({c}), gh = empty({m, 4 * c}), dx = empty({m, c}), dw1 = empty({4 * c, c});
      Tensor db1 = empty({4 * c});
      for (auto _ : st) {
        if (way == Mlp::one_op) {
          cpu::mlp_scale_residual_forward(x, w1, b1, w2, b2, gamma, r, h, y, out, tile);
          if (backward)
            cpu::mlp_scale_residual_backward(g, x, h, y, w1, w2, gamma, dx, dw1, db1, dw2, db2, dgamma, tile);
        } else if (way == Mlp::fused) {
          cpu::linear_gelu_forward(x, w1, b1, h, a, tile);
          cpu::linear_scale_residual_forward(a, w2, b2, gamma, r, y, out, tile);
          if (!backward) continue;
          cpu::linear_scale_residual_backward(g, a, y, w2, gamma, gb, da, dw2, db2, dgamma, tile);
          cpu::linear_gelu_backward(da, x, h, w1, gh, dx, dw1, db1, tile);
        } else {
          cpu::linear_forward(x, w1, b1, h);
          cpu::gelu_forward(h, a);
          cpu::linear_forward(a, w2, b2, y);
          cpu::residual_scale_add(r, y, gamma, out);
          if (!backward) continue;
          cpu::channel_scale_backward(g, y, gamma, gb, dgamma);
          cpu::linear_backward(gb, a, w2, da, dw2, db2);
          cpu::gelu_backward(da, h, gh);
          cpu::linear_backward(gh, x, w1, dx, dw1, db1);
        }
      }
      rate(st, "FLOP/s", backward ? flops : flops / 3);
    };
  };
  const std::string s = nhwc(n, hw, c);
  reg("block_mlp/unfused/" + s, body(Mlp::unfused, 0));
  reg("block_mlp/fused/" + s, body(Mlp::fused, 0));
  reg("block_mlp_fwd/unfused/" + s,
      body(Mlp::unfused, 0, false));  // eval, and a checkpointed block's first pass
  reg("block_mlp_fwd/fused/" + s, body(Mlp::fused, 0, false));
  if (mlp_as_one_op(false, c, 4 * c)) {
    reg("block_mlp/one_op/" + s, body(Mlp::one_op, 0));
    reg("block_mlp_fwd/one_op/" + s, body(Mlp::one_op, 0, false));
  }
  for (int64_t t : tiles) reg(fmt::format("block_mlp/fused_tile{}/{}", t, s), body(Mlp::fused, t));
}

// Patchify conv: x (n, hw, hw, cin) -> (n, hw / k, hw / k, cout).
void add_patchify(int64_t n, int64_t hw, int64_t cin, int64_t k, int64_t cout) {
  const std::string name = fmt::format("{}_k{}_{}", nhwc(n, hw, cin), k, cout);
  const Shape x_shape{n, hw, hw, cin}, y_shape{n, hw / k, hw / k, cout}, w_shape{cout, k, k, cin};
  const double flops = 2 * double(n * (hw / k) * (hw / k)) * double(k * k * cin * cout);
  reg(("patchify_fwd/" + name), [=](benchmark::State& st) {
    const Tensor x = uniform(x_shape, 1), w = uniform(w_shape, 2), b = uniform({cout}, 3);
    Tensor y = empty(y_shape);
    for (auto _ : st) cpu::patchify_conv2d_forward(x, w, b, y);
    rate(st, "FLOP/s", flops);
  });
  reg(("patchify_bwd/" + name), [=](benchmark::State& st) {
    const Tensor x = uniform(x_shape, 1), w = uniform(w_shape, 2), gy = uniform(y_shape, 3);
    Tensor dx = empty(x_shape), dw = empty(w_shape), db = empty({cout});
    for (auto _ : st) cpu::patchify_conv2d_backward(gy, x, w, dx, dw, db);
    rate(st, "FLOP/s", 2 * flops);
  });
}

}  // namespace
}  // namespace cz

int main(int argc, char** argv) {
  // Note [Passive OpenMP waits] (measured here too: LayerNorm 1 ms -> 8 ms on 2 loaded cores when spinning).
  cz::use_passive_omp_waits(argv);
  cz::configure_cpu_threads(1);
  // The block's MLP fused and unfused: ConvNeXt-T (batch 8, 224 px) and atto (batch 32, 64 px) stages; the
  // tile sweep at the two stages with the most rows.
  const std::vector<int64_t> sweep = {32, 64, 128, 256, 512, 1024};
  for (auto [hw, c] : {std::pair{56, 96}, {28, 192}, {14, 384}, {7, 768}})
    cz::add_block_mlp(8, hw, c, hw == 56 ? sweep : std::vector<int64_t>{});
  for (auto [hw, c] : {std::pair{16, 40}, {8, 80}, {4, 160}, {2, 320}})
    cz::add_block_mlp(32, hw, c, hw == 16 ? sweep : std::vector<int64_t>{});
  // ConvNeXt-T at 224px, batch 8.
  for (auto [hw, c] : {std::pair{56, 96}, {28, 192}, {14, 384}, {7, 768}}) cz::add_stage(8, hw, c);
  cz::add_patchify(8, 224, 3, 4, 96);
  cz::add_patchify(8, 56, 96, 2, 192);
  // ConvNeXt-atto at 64px, batch 32 (the training target).
  for (auto [hw, c] : {std::pair{16, 40}, {8, 80}, {4, 160}, {2, 320}}) cz::add_stage(32, hw, c);
  cz::add_patchify(32, 64, 3, 4, 40);
  for (auto [hw, c] : {std::pair{16, 40}, {8, 80}, {4, 160}}) cz::add_patchify(32, hw, c, 2, 2 * c);

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("cpu_threads", std::to_string(cz::cpu_threads()));
  benchmark::AddCustomContext("omp_wait_policy",
                              std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
