// The 7x7 depthwise convolutions of ConvNeXt on one GPU, stage by stage: forward and backward (dx, dw, db) on
// our tiled kernels and on cuDNN (DepthwiseAlgo), each against its bounds: the f32 FMA bound (N H W C 49
// multiply-adds per direction: the kernels accumulate in f32, so --peak-fp32-tflops, the non-tensor-core
// peak) and the memory bound (each tensor read or written once: x and y forward; gy, x and dx backward). The
// per-step totals (3, 3, 9 and 3 layers per stage for ConvNeXt-T) are what issue 13's 3 ms goal is about.
// scripts/gpu-check.sh runs it; scripts/gpu_check_summary.py prints its table.
//
//   bench_depthwise_cuda [--dtype bf16] [--batch 64] [--image 224] [--iters 10] [--peak-fp32-tflops T]
//                        [--peak-gbps B] [--json FILE]
#include <algorithm>
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
  double peak_fp32_tflops = 0;  // 0: no FMA bound
  double peak_gbps = 0;         // 0: no memory bound
};

Flags parse(int argc, char** argv) {
  Flags f;
  CLI::App app{
      "bench_depthwise_cuda: ConvNeXt-T's 7x7 depthwise convolutions, tiled and cuDNN, against their bounds"};
  bench::add_shape_flags(app, f);
  app.add_option("--peak-fp32-tflops", f.peak_fp32_tflops, "the GPU's fp32 FMA peak (0: no FMA bound)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--peak-gbps", f.peak_gbps, "the GPU's memory bandwidth (0: no memory bound)")
      ->check(CLI::NonNegativeNumber);
  bench::add_json_flag(app, f);
  bench::parse_or_exit(app, argc, argv);
  return f;
}

int run(const Flags& f) {
  if (bench::no_gpu("bench_depthwise_cuda")) return 1;
  const Device dev = Device::cuda(0);
  const DType t = parse_dtype(f.dtype);
  cuda::DeviceContext& ctx = cuda::context(dev.index);
  const Stream s = cuda::compute_stream(dev.index);
  StreamGuard guard(s);
  const double elem = double(dtype_size(t));

  auto time_ms = [&](auto&& fn) { return bench::device_ms(dev, s, f.iters, fn); };
  // The larger of the FMA and the memory bound, in ms (0 when neither peak is known).
  auto bound_ms = [&](double fma, double bytes) {
    const double by_fma = f.peak_fp32_tflops > 0 ? 2 * fma / (f.peak_fp32_tflops * 1e9) : 0;
    const double by_bytes = f.peak_gbps > 0 ? bytes / (f.peak_gbps * 1e6) : 0;
    return std::pair{by_fma, by_bytes};
  };

  // ConvNeXt-T: widths 96, 192, 384, 768 at strides 4, 8, 16, 32, with 3, 3, 9, 3 blocks.
  const int64_t widths[4] = {96, 192, 384, 768}, layers[4] = {3, 3, 9, 3};
  std::string rows_json;
  double step_ms[2] = {0, 0}, step_bound = 0;
  int64_t side = f.image / 4;
  for (int st = 0; st < 4; ++st, side /= 2) {
    const int64_t c = widths[st], n = f.batch;
    const Tensor x = full({n, side, side, c}, 0.01, t, dev), w = full({7, 7, c}, 0.01, t, dev),
                 b = full({c}, 0.01, t, dev), gy = full({n, side, side, c}, 0.01, t, dev);
    Tensor y = empty(x.sizes(), t, dev), dx = empty(x.sizes(), t, dev), dw = empty(w.sizes(), t, dev),
           db = empty({c}, t, dev);
    const double pixels = double(n * side * side * c), fma = pixels * 49;
    const auto [fwd_fma, fwd_bytes] = bound_ms(fma, 2 * pixels * elem);
    const auto [bwd_fma, bwd_bytes] = bound_ms(2 * fma, 3 * pixels * elem);
    const double fwd_bound = std::max(fwd_fma, fwd_bytes), bwd_bound = std::max(bwd_fma, bwd_bytes);
    step_bound += double(layers[st]) * (fwd_bound + bwd_bound);
    const cuda::DepthwiseAlgo algos[2] = {cuda::DepthwiseAlgo::tiled, cuda::DepthwiseAlgo::cudnn};
    for (int a = 0; a < 2; ++a) {
      ctx.set_depthwise_algo(algos[a]);
      const double fwd = time_ms([&] { cuda::depthwise_conv2d_forward(x, w, b, y, s); });
      const double bwd = time_ms([&] { cuda::depthwise_conv2d_backward(gy, x, w, dx, dw, db, s); });
      step_ms[a] += double(layers[st]) * (fwd + bwd);
      const char* path = cuda::depthwise_algo_name(algos[a]);
      std::printf(
          "[depthwise] %s stage %d (C=%lld, %lldx%lld, batch %lld) %s: forward %.3f ms (bound %.3f: FMA "
          "%.3f, "
          "memory %.3f), backward %.3f ms (bound %.3f: FMA %.3f, memory %.3f)\n",
          f.dtype.c_str(), st + 1, (long long)c, (long long)side, (long long)side, (long long)n, path, fwd,
          fwd_bound, fwd_fma, fwd_bytes, bwd, bwd_bound, bwd_fma, bwd_bytes);
      rows_json += fmt::format(
          "{}{{\"stage\": {}, \"c\": {}, \"side\": {}, \"layers\": {}, \"path\": \"{}\", \"fwd_ms\": {:.5f}, "
          "\"bwd_ms\": {:.5f}, \"fwd_fma_ms\": {:.5f}, \"fwd_mem_ms\": {:.5f}, \"bwd_fma_ms\": {:.5f}, "
          "\"bwd_mem_ms\": {:.5f}}}",
          rows_json.empty() ? "" : ", ", st + 1, c, side, layers[st], path, fwd, bwd, fwd_fma, fwd_bytes,
          bwd_fma, bwd_bytes);
    }
  }
  ctx.set_depthwise_algo(cuda::DepthwiseAlgo::tiled);
  std::printf(
      "[depthwise] %s per ConvNeXt-T step at batch %lld: tiled %.3f ms, cudnn %.3f ms, bound %.3f ms\n",
      f.dtype.c_str(), (long long)f.batch, step_ms[0], step_ms[1], step_bound);

  if (!f.json.empty()) {
    bench::write_json_line(
        f.json, fmt::format("{{\"impl\": \"depthwise\", \"dtype\": \"{}\", \"batch\": {}, \"image\": {}, "
                            "\"peak_fp32_tflops\": {}, \"peak_gbps\": {}, \"step_ms\": {{\"tiled\": {:.5f}, "
                            "\"cudnn\": {:.5f}}}, \"step_bound_ms\": {:.5f}, \"rows\": [{}]}}",
                            f.dtype, f.batch, f.image, f.peak_fp32_tflops, f.peak_gbps, step_ms[0],
                            step_ms[1], step_bound, rows_json));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cz::bench::run_main("bench_depthwise_cuda", [&] { return run(parse(argc, argv)); });
}
