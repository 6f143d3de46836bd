// AdamW update throughput over a ConvNeXt-T sized flat buffer (28.6M f32 parameters, its real layout and
// weight-decay pieces; also its first 64K parameters, which stay in L2): the SIMD + OpenMP kernel against a
// plain scalar loop and an `omp simd` loop in the same process, in GB/s (28 bytes moved per parameter) and
// parameters/s, with the speedups over the scalar loop printed at the end.
//   build/bench/bench_optim --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include "adamw_reference.h"
#include "optim/adamw.h"
#include "optim/cpu_kernels.h"
#include "tensor/cpu/simd.h"

namespace cz::bench {
namespace {

constexpr double kBytesPerParam = 28;  // reads p, g, m, v; writes p, m, v (f32)

// ConvNeXt-T's parameters in timm's order (28,589,128 of them), aligned like flatten_parameters(…, 16).
FlatLayout convnext_tiny_layout() {
  FlatLayout l;
  l.align = 16;
  const auto add = [&](std::string name, Shape shape) {
    const int64_t n = shape_numel(shape);
    l.segments.push_back({std::move(name), l.numel, n, std::move(shape)});
    l.numel += (n + 15) / 16 * 16;
  };
  const int64_t dims[] = {96, 192, 384, 768}, depths[] = {3, 3, 9, 3};
  add("stem.0.weight", {96, 3, 4, 4});
  add("stem.0.bias", {96});
  add("stem.1.weight", {96});
  add("stem.1.bias", {96});
  for (int s = 0; s < 4; ++s) {
    const int64_t d = dims[s];
    const std::string st = "stages." + std::to_string(s);
    if (s > 0) {
      add(st + ".downsample.0.weight", {dims[s - 1]});
      add(st + ".downsample.0.bias", {dims[s - 1]});
      add(st + ".downsample.1.weight", {d, dims[s - 1], 2, 2});
      add(st + ".downsample.1.bias", {d});
    }
    for (int b = 0; b < depths[s]; ++b) {
      const std::string bl = st + ".blocks." + std::to_string(b);
      add(bl + ".gamma", {d});
      add(bl + ".conv_dw.weight", {d, 1, 7, 7});
      add(bl + ".conv_dw.bias", {d});
      add(bl + ".norm.weight", {d});
      add(bl + ".norm.bias", {d});
      add(bl + ".mlp.fc1.weight", {4 * d, d});
      add(bl + ".mlp.fc1.bias", {4 * d});
      add(bl + ".mlp.fc2.weight", {d, 4 * d});
      add(bl + ".mlp.fc2.bias", {d});
    }
  }
  add("head.norm.weight", {768});
  add("head.norm.bias", {768});
  add("head.fc.weight", {1000, 768});
  add("head.fc.bias", {1000});
  return l;
}

struct Buffers {
  FlatLayout layout = convnext_tiny_layout();
  std::vector<ShardPiece> pieces =
      shard_pieces(layout, ShardRange::whole(layout), timm_weight_decay(layout, 0.05));
  Tensor p, g, m, v;

  Buffers() {
    const int64_t n = layout.numel;
    p = empty({n});
    g = empty({n});
    m = empty({n});
    v = empty({n});
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    float *pp = p.data<float>(), *gp = g.data<float>(), *mp = m.data<float>(), *vp = v.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      pp[i] = 0.02f * dist(rng);
      gp[i] = 1e-3f * dist(rng);
      mp[i] = 1e-4f * dist(rng);
      vp[i] = 1e-7f * std::abs(dist(rng));
    }
  }
};

Buffers& buffers() {
  static Buffers b;
  return b;
}

constexpr AdamWStepArgs kArgs{1e-3, 0.9, 0.999, 1e-8, 100};

AdamWRefConsts ref_consts(const ShardPiece& piece) {
  const double lr = kArgs.lr * piece.lr_scale;
  const double bc1 = 1 - std::pow(kArgs.beta1, double(kArgs.step)),
               bc2 = 1 - std::pow(kArgs.beta2, double(kArgs.step));
  return {
      float(1 - lr * piece.weight_decay), float(1 - kArgs.beta1), float(kArgs.beta2), float(1 - kArgs.beta2),
      float(1 / std::sqrt(bc2)),          float(kArgs.eps),       float(-lr / bc1)};
}

// The naive loop with `#pragma omp simd`: what the compiler makes of it without intrinsics.
void adamw_omp_simd(float* p, const float* g, float* m, float* v, int64_t n, const AdamWRefConsts& c) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) adamw_element(p, g, m, v, i, c);
}

void set_counters(benchmark::State& state, int64_t n) {
  state.SetBytesProcessed(int64_t(double(state.iterations()) * double(n) * kBytesPerParam));
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["params"] = double(n);
}

// The first n parameters (state.range(0); 0 = all) as a shard, with its pieces.
struct Shard {
  int64_t n;
  std::vector<ShardPiece> pieces;
  Tensor p, g, m, v;
};

Shard shard_of(const benchmark::State& state) {
  Buffers& b = buffers();
  const int64_t n = state.range(0) > 0 ? std::min(state.range(0), b.layout.numel) : b.layout.numel;
  return {n,
          shard_pieces(b.layout, {0, n}, timm_weight_decay(b.layout, 0.05)),
          b.p.narrow(0, 0, n),
          b.g.narrow(0, 0, n),
          b.m.narrow(0, 0, n),
          b.v.narrow(0, 0, n)};
}

template <void (*Loop)(float*, const float*, float*, float*, int64_t, const AdamWRefConsts&)>
void run_reference(benchmark::State& state) {
  const Shard s = shard_of(state);
  float *p = s.p.data<float>(), *g = s.g.data<float>(), *m = s.m.data<float>(), *v = s.v.data<float>();
  for (auto _ : state) {
    for (const ShardPiece& piece : s.pieces)
      Loop(p + piece.begin, g + piece.begin, m + piece.begin, v + piece.begin, piece.end - piece.begin,
           ref_consts(piece));
    benchmark::ClobberMemory();
  }
  set_counters(state, s.n);
}

void BM_AdamW_Scalar(benchmark::State& state) {
  run_reference<adamw_scalar>(state);
}
void BM_AdamW_OmpSimd(benchmark::State& state) {
  run_reference<adamw_omp_simd>(state);
}

// The library kernel (tensor/cpu/simd.h's widest vectors) with state.range(1) OpenMP threads; 0 = the default
// team.
void BM_AdamW_Kernel(benchmark::State& state) {
  Shard s = shard_of(state);
  const int saved = omp_get_max_threads();
  const int threads = state.range(1) > 0 ? int(state.range(1)) : saved;
  omp_set_num_threads(threads);
  for (auto _ : state) {
    cpu::adamw_step(s.p, s.g, s.m, s.v, s.pieces, kArgs);
    benchmark::ClobberMemory();
  }
  omp_set_num_threads(saved);
  set_counters(state, s.n);
  state.counters["threads"] = threads;
  state.SetLabel(cpu::simd::kIsaName);
}

// The memory-bandwidth bound the update is measured against (issue: CPU offload, Note [CPU offload]): a
// STREAM-like triad a = b + s*c over arrays as large as the AdamW buffers, with state.range(0) threads,
// counting the bytes that really move: b and c read, a read for ownership and written (16 bytes per element;
// the AdamW update writes only lines it has read, so its 28 bytes per parameter are all real traffic).
constexpr double kTriadBytes = 16;

void BM_Triad(benchmark::State& state) {
  Buffers& b = buffers();
  const int64_t n = b.layout.numel;
  float *a = b.p.data<float>(), *x = b.m.data<float>(), *y = b.v.data<float>();
  const int saved = omp_get_max_threads();
  const int threads = int(state.range(0));
  for (auto _ : state) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = x[i] + 0.5f * y[i];
    benchmark::ClobberMemory();
  }
  omp_set_num_threads(saved);
  state.SetBytesProcessed(int64_t(double(state.iterations()) * double(n) * kTriadBytes));
  state.counters["threads"] = threads;
}

constexpr int64_t kInCache = 1 << 16;  // 64K parameters: 1 MiB of p, g, m, v together, inside L2
BENCHMARK(BM_AdamW_Scalar)->Arg(kInCache)->Arg(0)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_AdamW_OmpSimd)->Arg(kInCache)->Arg(0)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_AdamW_Kernel)
    ->Args({kInCache, 1})
    ->Args({0, 1})
    ->Args({0, 2})
    ->Args({0, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_Triad)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Console output plus, at the end, each benchmark's speedup over BM_AdamW_Scalar of the same size (the first
// argument), from medians when repeated: in real time, and in CPU time of the benchmark thread, which is the
// steadier figure for 1-thread runs on a shared, oversubscribed machine (it leaves out time spent preempted;
// it also leaves out OpenMP worker threads, so it is not comparable for multi-thread runs).
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      const std::string name = r.run_name.str();
      const Times t{r.GetAdjustedRealTime(), r.GetAdjustedCPUTime()};
      if (r.run_type == Run::RT_Iteration) runs_[name].push_back(t);
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median") median_[name] = t;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::map<std::string, Times> t = median_;
    for (auto& [name, v] : runs_) {
      if (t.count(name)) continue;
      std::sort(v.begin(), v.end(), [](const Times& a, const Times& b) { return a.real < b.real; });
      t[name] = v[v.size() / 2];
    }
    std::printf("\nspeedup over BM_AdamW_Scalar of the same size (%s)   real time   cpu time\n",
                median_.empty() ? "single runs" : "medians");
    for (const auto& [name, time] : t) {
      const size_t a = name.find('/'), b = name.find('/', a + 1);
      if (a == std::string::npos) continue;
      const auto base =
          t.find("BM_AdamW_Scalar" + name.substr(a, b == std::string::npos ? b : b - a) + "/real_time");
      if (base != t.end())
        std::printf("  %-52s %8.2fx %9.2fx\n", name.c_str(), base->second.real / time.real,
                    base->second.cpu / time.cpu);
    }
    // The whole-model update against the bandwidth bound at the same thread count: bound = triad bytes/s /
    // 28 bytes per parameter.
    const double n = double(buffers().layout.numel);
    std::printf("\nAdamW (all %.0f parameters) against the triad bound   Mparams/s   bound   fraction\n", n);
    for (int threads : {1, 2}) {
      const auto k = t.find("BM_AdamW_Kernel/0/" + std::to_string(threads) + "/real_time");
      const auto tr = t.find("BM_Triad/" + std::to_string(threads) + "/real_time");
      if (k == t.end() || tr == t.end()) continue;
      // Google Benchmark reports microseconds per iteration here.
      const double mparams = n / k->second.real, bound = n * kTriadBytes / tr->second.real / kBytesPerParam;
      std::printf("  %d thread(s)%41.0f %7.0f %9.0f%%\n", threads, mparams, bound, 100 * mparams / bound);
    }
  }

 private:
  struct Times {
    double real = 0, cpu = 0;
  };
  std::map<std::string, std::vector<Times>> runs_;
  std::map<std::string, Times> median_;
};

}  // namespace
}  // namespace cz::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("AdamW over %lld f32 parameters (ConvNeXt-T layout, %zu pieces), %d OpenMP threads available\n",
              static_cast<long long>(cz::bench::buffers().layout.numel), cz::bench::buffers().pieces.size(),
              omp_get_max_threads());
  cz::bench::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
