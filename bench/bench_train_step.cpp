// Times the app's training step, Trainer::step (forward, cross-entropy, the ZeRO engine's backward and step:
// the function convnext_zero runs), on fixed random images and labels generated once on the device, on the
// CPU or a GPU, in f32 or with bf16/f16 compute on fp32 master weights (the trainer's Note [Mixed
// precision]), at any --stage and with --offload. The peer figure is bench/train_step_torch.py
// (scripts/gpu-check.sh runs both).
// With --peak-tflops it reports the model FLOP utilisation (6 x the forward MACs per image, Note in
// nn/convnext.h); with --profile N it runs N more steps under the op profiler (Note [Op profiling]) and
// prints where a step's time goes, op by op.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "bench_main.h"
#include "dist/comm/bootstrap.h"
#include "dist/train/trainer.h"
#include "nn/convnext.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tensor/profiler.h"
#include "tensor/random.h"
#if CZ_WITH_CUDA
#include "tensor/cuda/context.h"
#endif

namespace {

using namespace cz;

struct Flags {
  std::string model = "tiny";
  std::string device = "cpu";
  std::string dtype = "f32";  // f32 | bf16 | f16 (f16 needs cuda; bf16 on the CPU: bf16 GEMMs)
  int64_t batch = 8;
  int64_t image = 224;
  int warmup = 3;
  int steps = 10;
  bool conv_benchmark = true;  // cuDNN algorithm timing on first use (Note [Convolution algorithms]) ...
  bool reproducible = true;    // ... which runs only with this off (Note [Reproducible runs])
  bool tf32 = false;
  std::string depthwise = "tiled";  // depthwise kernels: tiled (ours, default), cudnn, direct
  bool gemm_epilogues = true;    // cuBLASLt's bias / bias-gradient epilogues (off: plain GEMMs + our kernels)
  bool patchify_gemm = false;    // patchify convolutions as one GEMM over their patches instead of cuDNN
  std::string json;              // also write the result here
  double peak_tflops = 0;        // the device's peak for this dtype: enables the MFU figure
  int profile_steps = 0;         // extra steps under the op profiler
  int stage = 0;                 // ZeRO stage (a world of one: the engine's buffers and copies, no traffic)
  bool offload = false;          // --offload-optimizer
  bool offload_overlap = false;  // --offload-overlap-step
  // The app's --cuda-graphs; off by default, so the figure stays the eager step's, as recorded before graphs.
  std::string cuda_graphs = "off";
  std::string cpu_row_split = "fast";  // the app's --cpu-row-split (Note [Cutting the rows])
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(
      stderr,
      "bench_train_step: %s\n"
      "usage: bench_train_step [--model tiny] [--device cpu|cuda[:i]] [--dtype f32|bf16|f16]\n"
      "                        [--batch 8] [--image 224] [--warmup 3] [--steps 10]\n"
      "                        [--no-conv-benchmark] [--not-reproducible] [--tf32] [--depthwise-cudnn]\n"
      "                        [--depthwise-direct] [--no-gemm-epilogues] [--patchify-gemm] [--json FILE]\n"
      "                        [--peak-tflops T] [--profile N] [--stage 0-3] [--offload] "
      "[--offload-overlap-step]\n"
      "                        [--cuda-graphs auto|on|off (default off)] [--cpu-row-split "
      "fast|fixed|rows:N]\n",
      msg);
  std::exit(2);
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + std::string(a)).c_str());
      return argv[++i];
    };
    if (a == "--model")
      f.model = value();
    else if (a == "--device")
      f.device = value();
    else if (a == "--dtype")
      f.dtype = value();
    else if (a == "--batch")
      f.batch = std::stoll(value());
    else if (a == "--image")
      f.image = std::stoll(value());
    else if (a == "--warmup")
      f.warmup = std::stoi(value());
    else if (a == "--steps")
      f.steps = std::stoi(value());
    else if (a == "--no-conv-benchmark")
      f.conv_benchmark = false;
    else if (a == "--tf32")
      f.tf32 = true;
    else if (a == "--cuda-graphs")
      f.cuda_graphs = value();
    else if (a == "--cpu-row-split")
      f.cpu_row_split = value();
    else if (a == "--not-reproducible")
      f.reproducible = false;
    else if (a == "--depthwise-cudnn")
      f.depthwise = "cudnn";
    else if (a == "--depthwise-direct")
      f.depthwise = "direct";
    else if (a == "--no-gemm-epilogues")
      f.gemm_epilogues = false;
    else if (a == "--patchify-gemm")
      f.patchify_gemm = true;
    else if (a == "--json")
      f.json = value();
    else if (a == "--peak-tflops")
      f.peak_tflops = std::stod(value());
    else if (a == "--profile")
      f.profile_steps = std::stoi(value());
    else if (a == "--stage")
      f.stage = std::stoi(value());
    else if (a == "--offload")
      f.offload = true;
    else if (a == "--offload-overlap-step")
      f.offload = f.offload_overlap = true;
    else if (a == "-h" || a == "--help")
      usage("help");
    else
      usage(("unknown flag " + std::string(a)).c_str());
  }
  if (f.batch <= 0 || f.image <= 0 || f.steps <= 0 || f.warmup < 0 || f.profile_steps < 0 ||
      !(f.peak_tflops >= 0) || !std::isfinite(f.peak_tflops))
    usage("sizes and counts must be positive");
  return f;
}

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  usage(("unknown --dtype " + s).c_str());
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) return Device::cuda(std::stoi(s.substr(5)));
  usage(("unknown --device " + s).c_str());
}

void sync(Device d) {
  if (d.is_cuda()) current_stream(d).synchronize();
}

int run(const Flags& f) {
  const Device dev = parse_device(f.device);
  const DType compute = parse_dtype(f.dtype);
  // On the CPU bf16 is the GEMMs' precision in an fp32 model (Note [bf16 on the CPU]); the trainer checks the
  // CPU.
  CZ_CHECK(dev.is_cuda() || compute != DType::f16,
           "--dtype f16 needs --device cuda (the CPU has bf16 GEMMs at most)");
  dist::World& world = dist::World::init(nullptr, nullptr);  // a world of one
  const nn::ConvNeXtConfig mc = nn::convnext_variant(f.model);
  train::TrainConfig c;
  c.model = f.model;
  c.num_classes = mc.num_classes;
  c.image_size = f.image;
  c.micro_batch = f.batch;
  // The training set is never read (the steps run on the fixed batch below): the smallest one the trainer
  // accepts, decoded by nobody.
  c.data = fmt::format("synthetic:n={},eval_n=8,classes=10,size=8", f.batch);
  c.loader_threads = 0;
  c.steps = f.warmup + f.steps + f.profile_steps;
  c.lr = 1e-4;
  c.schedule = "constant";
  c.label_smoothing = 0.1;
  c.precision = compute == DType::f32 ? "fp32" : compute == DType::bf16 ? "bf16" : "fp16";
  c.device = f.device;
  c.tf32 = f.tf32;
  c.stage = f.stage;
  c.offload_optimizer = f.offload;
  c.offload_overlap_step = f.offload_overlap;
  c.progress = false;
  c.cuda_graphs = f.cuda_graphs;
  c.cpu_row_split = f.cpu_row_split;
  train::Trainer trainer(c, world);
#if CZ_WITH_CUDA
  std::optional<StreamGuard> stream_guard;
  if (dev.is_cuda()) {  // after the trainer, which sets its own defaults
    cuda::set_conv_benchmark(f.conv_benchmark);
    cuda::set_allow_tf32(f.tf32);
    cuda::set_reproducible(f.reproducible);
    cuda::set_depthwise_algo(f.depthwise == "cudnn"    ? cuda::DepthwiseAlgo::cudnn
                             : f.depthwise == "direct" ? cuda::DepthwiseAlgo::direct
                                                       : cuda::DepthwiseAlgo::tiled);
    cuda::set_gemm_epilogues(f.gemm_epilogues);
    cuda::set_patchify_gemm(f.patchify_gemm);
    stream_guard.emplace(cuda::compute_stream(dev.index));
  }
#endif
  Generator gen(1);
  Batch batch;
  batch.images =
      randn({f.batch, f.image, f.image, mc.in_chans}, gen, dev.is_cuda() ? compute : DType::f32, dev);
  batch.labels = randint(mc.num_classes, {f.batch}, gen, DType::i64, dev);
  const std::vector<Batch> batches{batch};
  double last_loss = 0;
  int64_t peak = 0;
  auto step = [&]() {
    const train::StepStats s = trainer.step(batches);
    last_loss = s.loss;
    peak = std::max(peak, s.peak_mem_bytes);
  };

  for (int i = 0; i < f.warmup; ++i) step();
  sync(dev);
  peak = 0;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  for (int i = 0; i < f.steps; ++i) step();
  sync(dev);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double img_s = double(f.batch) * f.steps / seconds;
  const double peak_gib = double(peak) / double(1 << 30);
  // Training FLOPs per image: forward, input gradients and weight gradients of the convolutions and GEMMs.
  const double flop_per_img = 6.0 * double(nn::convnext_forward_macs(mc, f.image));
  const double tflops = flop_per_img * img_s / 1e12;
  const double mfu = f.peak_tflops > 0 ? tflops / f.peak_tflops : NAN;
  // The switches off their defaults, as their flags without "--" (scripts/gpu_check_summary.py keys on it).
  std::string variant;
  for (const auto& [on, flag] :
       {std::pair{f.depthwise == "cudnn", "depthwise-cudnn"},
        std::pair{f.depthwise == "direct", "depthwise-direct"},
        std::pair{!f.gemm_epilogues, "no-gemm-epilogues"}, std::pair{f.patchify_gemm, "patchify-gemm"},
        std::pair{!f.reproducible, "not-reproducible"}})
    if (on) variant += fmt::format("{}{}", variant.empty() ? "" : ",", flag);
  const std::string shown = variant.empty() ? std::string() : fmt::format(" (--{})", variant);
  const char* dw = shown.c_str();
  std::printf(
      "bench_train_step: %s%s %s %s batch %lld image %lld: %.2f ms/step, %.1f img/s, %.3f TFLOP/s, peak %.2f "
      "GiB, loss %.4f (%d timed steps after %d warm-up)\n",
      mc.name.c_str(), dw, f.device.c_str(), f.dtype.c_str(), (long long)f.batch, (long long)f.image,
      1e3 * seconds / f.steps, img_s, tflops, peak_gib, last_loss, f.steps, f.warmup);
  if (f.cpu_row_split != "fast")
    std::printf("bench_train_step: --cpu-row-split %s\n", f.cpu_row_split.c_str());
  if (f.cuda_graphs != "off")
    std::printf("bench_train_step: CUDA graphs %s; %lld micro-steps and %lld updates replayed\n",
                trainer.cuda_graph_plan().note().c_str(), (long long)trainer.graph_replays(),
                (long long)trainer.graph_update_replays());
  if (f.peak_tflops > 0)
    std::printf("bench_train_step: MFU %.1f%% (%.1f of %.1f TFLOP/s; %.2f GFLOP per image)\n", 100 * mfu,
                tflops, f.peak_tflops, flop_per_img / 1e9);

  // Where the time goes: more steps with every op timed (these are slower; the figures above are not).
  std::vector<profiler::OpTime> ops;
  double profiled_ms = 0;
  if (f.profile_steps > 0) {
    (void)profiler::take();
    profiler::set_enabled(true);
    const auto p0 = Clock::now();
    for (int i = 0; i < f.profile_steps; ++i) step();
    sync(dev);
    profiled_ms = 1e3 * std::chrono::duration<double>(Clock::now() - p0).count() / f.profile_steps;
    profiler::set_enabled(false);
    ops = profiler::take();
    double attributed = 0;
    for (const auto& o : ops) attributed += o.ms / f.profile_steps;
    std::printf(
        "bench_train_step: per-op breakdown over %d profiled steps (%.2f ms/step with profiling; "
        "%.2f ms attributed to ops)\n%-28s %10s %12s %8s\n",
        f.profile_steps, profiled_ms, attributed, "op", "calls/step", "ms/step", "share");
    for (const auto& o : ops)
      std::printf("%-28s %10.1f %12.3f %7.1f%%\n", o.name.c_str(), double(o.calls) / f.profile_steps,
                  o.ms / f.profile_steps, 100 * o.ms / f.profile_steps / profiled_ms);
    std::printf("%-28s %10s %12.3f %7.1f%%\n", "(not in any op)", "", profiled_ms - attributed,
                100 * (profiled_ms - attributed) / profiled_ms);
  }

  if (!f.json.empty()) {
    std::string ops_json;
    for (const auto& o : ops)
      ops_json += fmt::format("{}{{\"name\": \"{}\", \"calls_per_step\": {:.2f}, \"ms_per_step\": {:.4f}}}",
                              ops_json.empty() ? "" : ", ", o.name, double(o.calls) / f.profile_steps,
                              o.ms / f.profile_steps);
    bench::write_json_line(
        f.json,
        fmt::format("{{\"impl\": \"convnext_zero\", \"model\": \"{}\", \"device\": \"{}\", "
                    "\"dtype\": \"{}\", \"batch\": {}, \"image\": {}, \"steps\": {}, "
                    "\"ms_per_step\": {:.4f}, \"img_per_s\": {:.3f}, \"train_flop_per_img\": {:.6g}, "
                    "\"tflops\": {:.3f}, \"mfu\": {}, \"peak_gib\": {:.4f}, \"loss\": {}, "
                    "\"variant\": \"{}\", \"depthwise\": \"{}\", \"gemm_epilogues\": {}, "
                    "\"patchify_gemm\": {}, \"cuda_graphs\": \"{}\", \"graph_replays\": {}, "
                    "\"profiled_ms_per_step\": {:.4f}, \"ops\": [{}]}}",
                    mc.name, f.device, f.dtype, f.batch, f.image, f.steps, 1e3 * seconds / f.steps, img_s,
                    flop_per_img, tflops, std::isfinite(mfu) ? fmt::format("{:.4f}", mfu) : "null", peak_gib,
                    std::isfinite(last_loss) ? fmt::format("{:.6f}", last_loss) : "null", variant,
                    f.depthwise, f.gemm_epilogues, f.patchify_gemm, f.cuda_graphs, trainer.graph_replays(),
                    profiled_ms, ops_json));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cz::bench::run_main("bench_train_step", [&] {
    const int rc = run(parse(argc, argv));
    cz::dist::World::finalize();
    return rc;
  });
}
