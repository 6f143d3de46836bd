// Every GEMM of a ConvNeXt training step timed on each CPU library (OpenBLAS, oneDNN, BLIS, libxsmm) at the
// process's threads: GFLOP/s, the share of the library's own peak and of the machine's, the fastest per
// shape, and what the step's GEMMs cost on each library and on the per-shape best (Note [CPU GEMM libraries];
// docs/performance.md, "CPU GEMM libraries").
//   bench_gemm_cpu [--run atto:64:32 --run tiny:224:16] [--reps 5] [--budget-s 0.3] [--peak-size 1024]
#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "nn/convnext.h"
#include "nn/convnext_gemms.h"
#include "tensor/check.h"
#include "tensor/cpu/gemm_choice.h"
#include "tensor/cpu/row_tiles.h"
#include "tensor/parallel.h"

namespace {

using cz::cpu::GemmLibrary;
using cz::cpu::kGemmLibraries;
constexpr size_t kLibs = kGemmLibraries.size();

struct Options {
  std::vector<std::string> runs{"atto:64:32", "tiny:224:16"};
  int reps = 5;
  double budget_s = 0.3;
  int64_t peak_size = 1024;
};

std::string cpuinfo_field(const std::string& field) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field, 0) == 0)
      if (auto colon = line.find(':'); colon != std::string::npos) {
        std::string v = line.substr(colon + 1);
        while (!v.empty() && v.front() == ' ') v.erase(v.begin());
        return v;
      }
  return "";
}

std::string lscpu_model() {
  if (FILE* p = popen("lscpu 2>/dev/null", "r")) {
    char buf[512];
    std::string model;
    while (std::fgets(buf, sizeof buf, p)) {
      std::string line = buf;
      if (line.rfind("Model name:", 0) == 0) {
        model = line.substr(11);
        while (!model.empty() && (model.front() == ' ')) model.erase(model.begin());
        while (!model.empty() && (model.back() == '\n' || model.back() == ' ')) model.pop_back();
      }
    }
    pclose(p);
    if (!model.empty()) return model;
  }
  return cpuinfo_field("model name");
}

// The machine's f32 peak: threads x clock x FLOPs per cycle. The clock is /proc/cpuinfo's "cpu MHz" (under a
// hypervisor, the nominal one); FLOPs per cycle are 2 (an FMA) x the vector's f32 lanes (16 with AVX-512F,
// 8 with AVX2) x 2 FMA units, which Xeons with AVX-512 have and which no file tells.
struct MachinePeak {
  double ghz = 0, flops_per_cycle = 0, gflops = 0;
  std::string how;
};
MachinePeak machine_peak(int threads) {
  MachinePeak p;
  p.ghz = std::atof(cpuinfo_field("cpu MHz").c_str()) / 1000;
  const std::string flags = " " + cpuinfo_field("flags") + " ";
  const int lanes = flags.find(" avx512f ") != std::string::npos ? 16
                    : flags.find(" fma ") != std::string::npos   ? 8
                                                                 : 4;
  p.flops_per_cycle = 2.0 * lanes * 2;
  p.gflops = threads * p.ghz * p.flops_per_cycle;
  p.how = fmt::format(
      "{} threads x {:.2f} GHz (/proc/cpuinfo) x {:.0f} f32 FLOPs/cycle (2 FMA units x {} lanes x 2) "
      "= {:.0f} GFLOP/s",
      threads, p.ghz, p.flops_per_cycle, lanes, p.gflops);
  return p;
}

double gflops(const cz::cpu::GemmShape& s, double seconds) {
  return s.flops() / seconds / 1e9;
}

// Seconds per call of `s` as the step runs it on the default library, under the process's cut (Note [Cutting
// the rows], row_tiles.h; CZ_CPU_ROW_SPLIT): a weight gradient (TN: m = the weight's rows, n = its columns,
// k = the batch's rows) by weight_grad, any other GEMM by gemm_rows; timed as time_gemm times a library call.
double time_as_run(const cz::cpu::GemmShape& s, int reps, double budget_s) {
  if (s.ta && !s.tb) {
    std::vector<float> g(size_t(s.k * s.m), 0.5f), x(size_t(s.k * s.n), 0.25f), dw(size_t(s.m * s.n));
    return cz::cpu::best_seconds(
        reps, budget_s, [&] { cz::cpu::weight_grad<float>(g.data(), x.data(), s.k, s.n, s.m, dw.data()); });
  }
  const int64_t ldb = s.tb ? s.k : s.n;
  std::vector<float> a(size_t(s.m * s.k), 0.5f), b(size_t(s.k * s.n), 0.25f), c(size_t(s.m * s.n));
  return cz::cpu::best_seconds(reps, budget_s, [&] {
    cz::cpu::gemm_rows<float>(s.tb, s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), ldb, 0.f, c.data(), s.n);
  });
}

void run_config(const std::string& spec, const Options& o, const std::array<double, kLibs>& own_peak,
                const MachinePeak& machine) {
  const auto c1 = spec.find(':'), c2 = spec.find(':', c1 == std::string::npos ? c1 : c1 + 1);
  CZ_CHECK(c1 != std::string::npos && c2 != std::string::npos, "--run must be MODEL:IMAGE:BATCH, got '{}'",
           spec);
  const cz::nn::ConvNeXtConfig cfg = cz::nn::convnext_variant(spec.substr(0, c1));
  const int64_t image = std::stoll(spec.substr(c1 + 1, c2 - c1 - 1)), batch = std::stoll(spec.substr(c2 + 1));
  const std::vector<cz::nn::NamedGemm> gemms = cz::nn::convnext_step_gemms(cfg, image, batch);

  fmt::print("\n## ConvNeXt-{} {} px, batch {}: {} GEMMs a step ({} distinct shapes)\n\n", cfg.name, image,
             batch, gemms.size(), cz::nn::distinct_gemm_shapes(gemms).size());
  fmt::print("| GEMM | shape (op(A) op(B) m x n x k) | calls |");
  for (GemmLibrary lib : kGemmLibraries)
    fmt::print(" {} GFLOP/s (% own peak) |", cz::cpu::gemm_library_name(lib));
  fmt::print(
      " fastest | its % of machine peak | auto's proxy pick | as the step runs it ({} cut), {} (% own "
      "peak) |\n|---|---|---|",
      cz::cpu::format_row_split(cz::cpu::row_split()),
      cz::cpu::gemm_library_name(cz::cpu::kDefaultGemmLibrary));
  for (size_t i = 0; i < kLibs; ++i) fmt::print("---|");
  fmt::print("---|---|---|---|\n");
  size_t default_l = 0;
  while (kGemmLibraries[default_l] != cz::cpu::kDefaultGemmLibrary) ++default_l;
  int at_80_whole = 0, at_80_as_run = 0;
  std::array<double, kLibs> step_s{};
  double best_step_s = 0, auto_step_s = 0, flops = 0;
  std::map<GemmLibrary, int> wins;
  for (const cz::nn::NamedGemm& g : gemms) {
    std::array<double, kLibs> t{};
    size_t best = 0;
    for (size_t l = 0; l < kLibs; ++l) {
      t[l] = cz::cpu::time_gemm(kGemmLibraries[l], g.shape, o.reps, o.budget_s);
      if (t[l] < t[best]) best = l;
      step_s[l] += double(g.calls) * t[l];
    }
    // What --cpu-gemm auto would pick from its short timing of the proxy shape.
    const GemmLibrary pick = cz::cpu::measure_fastest(g.shape);
    size_t pick_l = 0;
    while (kGemmLibraries[pick_l] != pick) ++pick_l;
    best_step_s += double(g.calls) * t[best];
    auto_step_s += double(g.calls) * t[pick_l];
    flops += double(g.calls) * g.shape.flops();
    ++wins[kGemmLibraries[best]];
    fmt::print("| {} | {} | {} |", g.name, cz::cpu::format_gemm_shape(g.shape), g.calls);
    for (size_t l = 0; l < kLibs; ++l) {
      const double gf = gflops(g.shape, t[l]);
      fmt::print(" {}{:.1f} ({:.0f}%){} |", l == best ? "**" : "", gf, 100 * gf / own_peak[l],
                 l == best ? "**" : "");
    }
    fmt::print(" {} | {:.0f}% | {} |", cz::cpu::gemm_library_name(kGemmLibraries[best]),
               100 * gflops(g.shape, t[best]) / machine.gflops, cz::cpu::gemm_library_name(pick));
    // The default library's share of its own peak, called whole and as the step calls it.
    double as_run = gflops(g.shape, t[default_l]) / own_peak[default_l];
    at_80_whole += as_run >= 0.8;
    const std::vector<cz::cpu::GemmShape> calls = cz::cpu::gemm_calls_as_run(g.shape);
    if (calls.size() != 1 || calls[0] != g.shape) {
      const double gf = gflops(g.shape, time_as_run(g.shape, o.reps, o.budget_s));
      as_run = gf / own_peak[default_l];
      fmt::print(" {:.1f} ({:.0f}%) |\n", gf, 100 * gf / own_peak[default_l]);
    } else {
      fmt::print(" (one call) |\n");
    }
    at_80_as_run += as_run >= 0.8;
    std::fflush(stdout);
  }
  fmt::print("\nThe step's GEMMs ({:.1f} GFLOP):", flops / 1e9);
  for (size_t l = 0; l < kLibs; ++l)
    fmt::print(" {} {:.1f} ms ({:.1f} GFLOP/s);", cz::cpu::gemm_library_name(kGemmLibraries[l]),
               1e3 * step_s[l], flops / step_s[l] / 1e9);
  fmt::print(" the fastest per shape {:.1f} ms ({:.1f} GFLOP/s); auto's picks {:.1f} ms. Fastest on:",
             1e3 * best_step_s, flops / best_step_s / 1e9, 1e3 * auto_step_s);
  for (const auto& [lib, n] : wins) fmt::print(" {} {},", cz::cpu::gemm_library_name(lib), n);
  fmt::print(" of {} GEMMs.\n", gemms.size());
  fmt::print(
      "{} at >= 80% of its own peak: {} of {} shapes called whole, {} as the step runs them (its cut's "
      "calls, where the cut does not make the shape one call).\n",
      cz::cpu::gemm_library_name(cz::cpu::kDefaultGemmLibrary), at_80_whole, gemms.size(), at_80_as_run);
}

int run(const Options& o) {
  const int threads = cz::cpu_threads();
  const MachinePeak machine = machine_peak(threads);
  fmt::print("# CPU GEMMs of a ConvNeXt training step, per library\n\n");
  fmt::print(
      "- CPU: {} (lscpu); OpenBLAS core type: {}; {} threads (OMP_NUM_THREADS or the cores available), "
      "OpenMP waits {}\n",
      lscpu_model(), cz::cpu::openblas_core_name(), threads,
      std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "default");
  fmt::print("- libraries:");
  for (GemmLibrary lib : kGemmLibraries) fmt::print(" {};", cz::cpu::gemm_library_version(lib));
  fmt::print("\n- machine peak: {}\n", machine.how);
  std::array<double, kLibs> own_peak{};
  const cz::cpu::GemmShape square{false, false, o.peak_size, o.peak_size, o.peak_size};
  // A square GEMM of ~2 GFLOP at 1024: long enough to reach the library's best, short enough that the best of
  // several calls escapes other processes' time slices on a shared machine.
  const int peak_reps = std::max(o.reps, 10);
  fmt::print("- each library's own peak: its GFLOP/s on a {}^3 NN GEMM (best of {}):", o.peak_size,
             peak_reps);
  for (size_t l = 0; l < kLibs; ++l) {
    own_peak[l] = gflops(square, cz::cpu::time_gemm(kGemmLibraries[l], square, peak_reps, 4 * o.budget_s));
    fmt::print(" {} {:.1f} ({:.0f}% of the machine's);", cz::cpu::gemm_library_name(kGemmLibraries[l]),
               own_peak[l], 100 * own_peak[l] / machine.gflops);
  }
  fmt::print(
      "\n- each cell: the best of up to {} calls after a warm-up, within {} s; the fastest in bold; "
      "\"auto's proxy pick\": what --cpu-gemm auto chose from its few-ms timing of the shape with the batch "
      "dimension cut (gemm_choice.h)\n",
      o.reps, o.budget_s);
  std::fflush(stdout);
  for (const std::string& spec : o.runs) run_config(spec, o, own_peak, machine);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cz::use_passive_omp_waits(argv);
  cz::configure_cpu_threads(1);
  Options o;
  CLI::App app{"ConvNeXt's GEMMs on each CPU GEMM library"};
  app.add_option("--run", o.runs, "MODEL:IMAGE:BATCH, repeatable (default atto:64:32 and tiny:224:16)");
  app.add_option("--reps", o.reps, "timed calls per cell, after one warm-up")->check(CLI::PositiveNumber);
  app.add_option("--budget-s", o.budget_s, "stop a cell's calls once this many seconds are spent")
      ->check(CLI::PositiveNumber);
  app.add_option("--peak-size", o.peak_size, "the square GEMM giving each library's own peak")
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
    return run(o);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_cpu: error: %s\n", e.what());
    return 1;
  }
}
