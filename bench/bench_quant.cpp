// Block-quantized INT8 kernels (src/dist/comm/quant.cpp) in GB/s of input (the f32 values a rank quantizes,
// or the f32 values dequantization writes), per block size, next to memcpy of the same f32 bytes in the same
// process (what any pass over the data costs). The per-hop step counts its f32 input b.
//   build/bench/bench_quant --benchmark_min_time=0.2 --benchmark_repetitions=5
//   --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <vector>

#include "dist/comm/quant.h"

namespace {

// Values per pass (the third argument): 128 Ki f32 (512 KiB) stay in this machine's 1 MiB L2, so the block
// size's own cost shows undisturbed by the other jobs' memory traffic; 4 Mi (16 MiB, a bucket's worth) is
// beyond L2, where the pass is bound by memory, like memcpy.
constexpr int64_t kInCache = 1 << 17, kOutOfCache = 1 << 22;

std::vector<float> normal_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(gen);
  return v;
}

struct Buffers {
  int64_t n, block;
  std::vector<float> x, y;
  std::vector<int8_t> q;
  std::vector<float> s;
  explicit Buffers(const benchmark::State& state)
      : n(state.range(2)),
        block(state.range(0)),
        x(normal_values(n, 1)),
        y(static_cast<size_t>(n)),
        q(static_cast<size_t>(n)),
        s(static_cast<size_t>(cz::dist::quant_scale_count(n, block))) {
    cz::dist::quantize(cz::DType::f32, x.data(), n, block, q.data(), s.data());
  }
};

// Args: block size, OpenMP threads, values.
void set_threads(benchmark::State& state) {
  omp_set_num_threads(int(state.range(1)));
}
void finish(benchmark::State& state, int64_t n) {
  state.SetBytesProcessed(state.iterations() * n * int64_t(sizeof(float)));
}

void BM_quantize(benchmark::State& state) {
  set_threads(state);
  Buffers b(state);
  for (auto _ : state) {
    cz::dist::quantize(cz::DType::f32, b.x.data(), b.n, b.block, b.q.data(), b.s.data());
    benchmark::ClobberMemory();
  }
  finish(state, b.n);
}

void BM_dequantize(benchmark::State& state) {
  set_threads(state);
  Buffers b(state);
  for (auto _ : state) {
    cz::dist::dequantize(b.q.data(), b.s.data(), b.n, b.block, cz::DType::f32, b.y.data());
    benchmark::ClobberMemory();
  }
  finish(state, b.n);
}

// One hop of the quantized reduce-scatter: Q(deq(a) + b).
void BM_dequantize_add_quantize(benchmark::State& state) {
  set_threads(state);
  Buffers b(state);
  std::vector<int8_t> out(b.q.size());
  std::vector<float> out_s(b.s.size());
  for (auto _ : state) {
    cz::dist::dequantize_add_quantize(b.q.data(), b.s.data(), b.x.data(), b.n, b.block, out.data(),
                                      out_s.data());
    benchmark::ClobberMemory();
  }
  finish(state, b.n);
}

void BM_quantize_with_feedback(benchmark::State& state) {
  set_threads(state);
  Buffers b(state);
  std::vector<float> residual(b.x.size(), 0.f);
  for (auto _ : state) {
    cz::dist::quantize_with_feedback(b.x.data(), residual.data(), b.n, b.block, b.q.data(), b.s.data());
    benchmark::ClobberMemory();
  }
  finish(state, b.n);
}

void BM_quantize_bf16(benchmark::State& state) {  // bytes: the bf16 input
  set_threads(state);
  Buffers b(state);
  std::vector<uint16_t> xb(b.x.size());
  for (size_t i = 0; i < xb.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &b.x[i], 4);
    xb[i] = uint16_t(u >> 16);
  }
  for (auto _ : state) {
    cz::dist::quantize(cz::DType::bf16, xb.data(), b.n, b.block, b.q.data(), b.s.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * b.n * 2);
}

void BM_quantize_int4(benchmark::State& state) {
  set_threads(state);
  Buffers b(state);
  std::vector<uint8_t> packed(static_cast<size_t>(cz::dist::quant4_code_bytes(b.n)));
  for (auto _ : state) {
    cz::dist::quantize_int4(cz::DType::f32, b.x.data(), b.n, b.block, packed.data(), b.s.data());
    benchmark::ClobberMemory();
  }
  finish(state, b.n);
}

void BM_dequantize_int4(benchmark::State& state) {
  set_threads(state);
  Buffers b(state);
  std::vector<uint8_t> packed(static_cast<size_t>(cz::dist::quant4_code_bytes(b.n)));
  cz::dist::quantize_int4(cz::DType::f32, b.x.data(), b.n, b.block, packed.data(), b.s.data());
  for (auto _ : state) {
    cz::dist::dequantize_int4(packed.data(), b.s.data(), b.n, b.block, cz::DType::f32, b.y.data());
    benchmark::ClobberMemory();
  }
  finish(state, b.n);
}

void BM_memcpy_f32(benchmark::State& state) {  // the peer: one read and one write of the f32 buffer
  const int64_t n = state.range(0);
  std::vector<float> x = normal_values(n, 2), y(static_cast<size_t>(n));
  for (auto _ : state) {
    std::memcpy(y.data(), x.data(), sizeof(float) * size_t(n));
    benchmark::ClobberMemory();
  }
  finish(state, n);
}

// One thread at every block size, timed in CPU time: on the shared 2-core machine the wall time of a pass is
// partly other jobs' (wall time ran 1.5-5x the CPU time), while the CPU time is the kernel's own. Out of
// cache and two threads (wall time: OpenMP workers' CPU time is not counted) at B = 256 only.
void block_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t block : {32, 64, 128, 256, 1024, 4096}) b->Args({block, 1, kInCache});
  b->Args({256, 1, kOutOfCache})->ArgNames({"B", "threads", "n"});
}
void two_threads(benchmark::internal::Benchmark* b) {
  b->Args({256, 2, kInCache})->Args({256, 2, kOutOfCache})->ArgNames({"B", "threads", "n"})->UseRealTime();
}
void one_size(benchmark::internal::Benchmark* b) {
  b->Args({256, 1, kInCache})->ArgNames({"B", "threads", "n"});
}

}  // namespace

BENCHMARK(BM_quantize)->Apply(block_sizes);
BENCHMARK(BM_dequantize)->Apply(block_sizes);
BENCHMARK(BM_dequantize_add_quantize)->Apply(block_sizes);
BENCHMARK(BM_quantize_int4)
    ->Args({32, 1, kInCache})
    ->Args({256, 1, kInCache})
    ->ArgNames({"B", "threads", "n"});
BENCHMARK(BM_dequantize_int4)
    ->Args({32, 1, kInCache})
    ->Args({256, 1, kInCache})
    ->ArgNames({"B", "threads", "n"});
BENCHMARK(BM_quantize_with_feedback)->Apply(one_size);
BENCHMARK(BM_quantize_bf16)->Apply(one_size);
BENCHMARK(BM_quantize)->Apply(two_threads);
BENCHMARK(BM_dequantize)->Apply(two_threads);
BENCHMARK(BM_memcpy_f32)->Arg(kInCache)->Arg(kOutOfCache)->ArgName("n");

BENCHMARK_MAIN();
