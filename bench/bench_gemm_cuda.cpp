// The cuBLASLt GEMMs of ConvNeXt's pointwise layers on one GPU: which epilogues cuBLASLt really fuses (BIAS,
// BGRADB, per dtype, read from the device context's path counters), and the time of each layer's forward,
// input-gradient and weight+bias-gradient GEMMs with the epilogues fused and without (plain GEMMs plus our
// own bias and column-sum kernels), side by side in the same process. The weight-gradient GEMMs have K =
// batch x tokens (200704 in stage 1 at batch 64) but only C x 4C outputs, so they need split-K (or stream-K)
// kernels to fill the GPU: where "dw+db" is much slower fused than unfused, cuBLASLt's BGRADB kernels do not
// split K and linear_backward should not ask for BGRADB on such shapes. scripts/gpu-check.sh runs it.
//
//   bench_gemm_cuda [--dtype bf16] [--batch 64] [--image 224] [--iters 10] [--peak-tflops T] [--json FILE]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench_main.h"
#include "device_time.h"
#include "shape_flags.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/kernels.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace {

using namespace cz;

using bench::parse_dtype;

struct Flags : bench::ShapeFlags {
  double peak_tflops = 0;  // the device's dense peak for this dtype: adds "% of peak"
};

Flags parse(int argc, char** argv) {
  Flags f;
  CLI::App app{"bench_gemm_cuda: ConvNeXt-T's pointwise GEMMs with and without cuBLASLt epilogues"};
  bench::add_shape_flags(app, f);
  app.add_option("--peak-tflops", f.peak_tflops, "the device's dense peak for this dtype (adds % of peak)")
      ->check(CLI::NonNegativeNumber);
  bench::add_json_flag(app, f);
  bench::parse_or_exit(app, argc, argv);
  return f;
}

// Which path one call took, from the context's counters.
struct PathProbe {
  std::string dtype, epilogue;
  bool fused = false;
};

std::vector<PathProbe> probe_paths(Device dev, Stream s) {
  cuda::DeviceContext& ctx = cuda::context(dev.index);
  cuda::GemmCounters& c = ctx.gemm_counters();
  const int64_t rows = 64, in = 96, out = 128;
  std::vector<PathProbe> paths;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor x = full({rows, in}, 0.01, t, dev), w = full({out, in}, 0.01, t, dev),
                 b = full({out}, 0.01, t, dev), gy = full({rows, out}, 0.01, t, dev);
    Tensor y = empty({rows, out}, t, dev), dw = empty({out, in}, t, dev), db = empty({out}, t, dev), none;
    const std::string name(dtype_name(t));
    auto probe = [&](const char* what, auto&& fn) {
      const int64_t fallbacks = c.epilogue_fallbacks;
      fn();
      paths.push_back({name, what, c.epilogue_fallbacks == fallbacks});
      std::printf("[gemm path] %s %s: %s\n", name.c_str(), what,
                  paths.back().fused ? "fused" : "UNFUSED fallback (plain GEMM + our kernel)");
    };
    probe("BIAS", [&] { cuda::linear_forward(x, w, b, y, s); });
    probe("BGRADB", [&] { cuda::linear_backward(gy, x, w, none, dw, db, s); });
  }
  s.synchronize();
  return paths;
}

struct Times {
  double fwd = 0, dx = 0, dw_db = 0;  // ms
};

int run(const Flags& f) {
  if (bench::no_gpu("bench_gemm_cuda")) return 1;
  const Device dev = Device::cuda(0);
  const DType t = parse_dtype(f.dtype);
  cuda::DeviceContext& ctx = cuda::context(dev.index);
  const Stream s = cuda::compute_stream(dev.index);
  StreamGuard guard(s);
  const std::vector<PathProbe> paths = probe_paths(dev, s);

  // ConvNeXt-T: stage widths 96, 192, 384, 768 at strides 4, 8, 16, 32.
  struct Layer {
    std::string name;
    int64_t rows, in, out;
  };
  std::vector<Layer> layers;
  int64_t side = f.image / 4;
  for (int64_t c : {96, 192, 384, 768}) {
    const int64_t tokens = f.batch * side * side;
    layers.push_back({fmt::format("C={} fc1", c), tokens, c, 4 * c});
    layers.push_back({fmt::format("C={} fc2", c), tokens, 4 * c, c});
    side /= 2;
  }

  auto time_ms = [&](auto&& fn) { return bench::device_ms(dev, s, f.iters, fn); };
  auto rate = [&](double flop, double ms) {
    const double tflops = flop / ms * 1e-9;
    return f.peak_tflops > 0
               ? fmt::format("{:.0f} TFLOP/s, {:.0f}% of peak", tflops, 100 * tflops / f.peak_tflops)
               : fmt::format("{:.0f} TFLOP/s", tflops);
  };

  std::string layers_json;
  for (const Layer& l : layers) {
    // Constant inputs: the timings do not depend on the values.
    const Tensor x = full({l.rows, l.in}, 0.01, t, dev), w = full({l.out, l.in}, 0.01, t, dev),
                 b = full({l.out}, 0.01, t, dev), gy = full({l.rows, l.out}, 0.01, t, dev);
    Tensor y = empty({l.rows, l.out}, t, dev), dx = empty({l.rows, l.in}, t, dev),
           dw = empty({l.out, l.in}, t, dev), db = empty({l.out}, t, dev), none;
    const double flop = 2.0 * double(l.rows) * double(l.in) * double(l.out);
    Times by_path[2];  // [0] fused, [1] unfused
    for (int unfused = 0; unfused < 2; ++unfused) {
      ctx.set_gemm_epilogues(unfused == 0);
      Times& tm = by_path[unfused];
      tm.fwd = time_ms([&] { cuda::linear_forward(x, w, b, y, s); });
      tm.dx = time_ms([&] { cuda::linear_backward(gy, x, w, dx, none, none, s); });
      tm.dw_db = time_ms([&] { cuda::linear_backward(gy, x, w, none, dw, db, s); });
    }
    ctx.set_gemm_epilogues(true);
    const Times &fu = by_path[0], &un = by_path[1];
    std::printf(
        "[gemm time] %s %s (%lld x %lld -> %lld): fwd %.3f ms fused (%s) / %.3f unfused; dx %.3f ms; "
        "dw+db %.3f ms fused (%s) / %.3f unfused: unfused/fused %.2f\n",
        f.dtype.c_str(), l.name.c_str(), (long long)l.rows, (long long)l.in, (long long)l.out, fu.fwd,
        rate(flop, fu.fwd).c_str(), un.fwd, fu.dx, fu.dw_db, rate(flop, fu.dw_db).c_str(), un.dw_db,
        un.dw_db / fu.dw_db);
    auto times_json = [](const Times& tm) {
      return fmt::format("{{\"fwd_ms\": {:.5f}, \"dx_ms\": {:.5f}, \"dw_db_ms\": {:.5f}}}", tm.fwd, tm.dx,
                         tm.dw_db);
    };
    layers_json += fmt::format(
        "{}{{\"name\": \"{}\", \"rows\": {}, \"in\": {}, \"out\": {}, \"fused\": {}, \"unfused\": {}}}",
        layers_json.empty() ? "" : ", ", l.name, l.rows, l.in, l.out, times_json(fu), times_json(un));
  }

  if (!f.json.empty()) {
    std::string paths_json;
    for (const PathProbe& p : paths)
      paths_json += fmt::format("{}{{\"dtype\": \"{}\", \"epilogue\": \"{}\", \"fused\": {}}}",
                                paths_json.empty() ? "" : ", ", p.dtype, p.epilogue, p.fused);
    bench::write_json_line(
        f.json, fmt::format("{{\"impl\": \"gemm\", \"dtype\": \"{}\", \"batch\": {}, \"image\": {}, "
                            "\"paths\": [{}], \"layers\": [{}]}}",
                            f.dtype, f.batch, f.image, paths_json, layers_json));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cz::bench::run_main("bench_gemm_cuda", [&] { return run(parse(argc, argv)); });
}
