// bf16 GEMMs with fp32 accumulation on oneDNN's matmul (AMX or AVX512_BF16), and the f32 -> bf16 rounding
// that feeds them.
//
// Note [bf16 on the CPU]: --precision bf16 on the CPU is what torch.set_float32_matmul_precision("medium")
// and oneDNN's bf16 fpmath mode are: the GEMMs (linear layers, the patchify convolutions, the head; every
// cz::cpu::gemm<float>) round their two operands to bf16 and multiply them on the bf16 units, accumulating
// and writing fp32; every other op, the activations, the gradients, the master weights and the optimizer stay
// fp32. A bf16 x bf16 product is exact in fp32, so the result is the fp32 GEMM of the rounded operands up to
// the order of the fp32 sums (tested). It is not CUDA's 16-bit compute copy: activations are not halved and
// the elementwise ops gain nothing (on the CPU they are memory-bound passes that would pay a conversion each
// way), and the engine keeps no 16-bit parameter copy, so a CPU bf16 run's memory is an fp32 run's plus the
// rounded operands of the GEMM in flight. We round the operands ourselves (VCVTNE2PS2BF16) rather than give
// oneDNN 2.6 f32 operands under the bf16 fpmath mode, whose matmul support came in later releases; the
// primitives are made once per shape and kept for the process, the rounded operands live in per-thread
// buffers, and a call from inside an OpenMP parallel region (a row tile of a larger GEMM) runs on its thread.
#include "tensor/cpu/gemm_bf16.h"

#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "tensor/check.h"
#include "tensor/cpu/cpu_features.h"
#include "tensor/cpu/gemm_choice.h"
#include "tensor/half.h"
#include "tensor/parallel.h"

namespace cz::cpu {
namespace {

void dnnl_ok(dnnl_status_t s, const char* what) {
  CZ_CHECK(s == dnnl_success, "bf16 GEMM: oneDNN's {} failed (status {})", what, int(s));
}

uint16_t round_one(float v) {
  return bf16_from_float_daz(v);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_avx512(const float* x, uint16_t* y,
                                                                                  int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(y + i, (__m512i)v);
  }
  for (; i < n; i += 16) {
    const int64_t r = n - i < 16 ? n - i : 16;
    const __mmask16 mask = __mmask16((1u << r) - 1);
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + i));
    _mm256_mask_storeu_epi16(y + i, mask, (__m256i)h);
  }
}

// Rows [r0, r1) of x (a multiple of 16 apart, but for the last), rounded and transposed into y (cols x rows):
// a masked gather takes one column of 16 rows, which become 16 consecutive bf16 values of y.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_transpose_avx512(
    const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* y, int64_t r0, int64_t r1) {
  const __m512i idx = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(int(ld)));
  for (int64_t r = r0; r < r1; r += 16) {
    const int64_t nr = r1 - r < 16 ? r1 - r : 16;
    const __mmask16 mask = __mmask16((1u << nr) - 1);
    const float* base = x + r * ld;
    for (int64_t c = 0; c < cols; ++c) {
      const __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, idx, base + c, 4);
      _mm256_mask_storeu_epi16(y + c * rows + r, mask, (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

// oneDNN's engine, made once; where AMX is hidden (CZ_CPU_DISABLE) oneDNN is held to AVX512_BF16, which works
// only before its first primitive (another user of oneDNN may have made one: then it stays as it is).
dnnl_engine_t engine() {
  static const dnnl_engine_t e = [] {
    if (!cpu_features().amx_bf16) dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core_bf16);
    dnnl_engine_t made = nullptr;
    dnnl_ok(dnnl_engine_create(&made, dnnl_cpu, 0), "engine_create");
    return made;
  }();
  return e;
}

// One shape's primitive (kept for the process, as cuDNN plans are).
struct Matmul {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_desc_t src{}, wei{}, dst{}, scratch{};
  size_t scratch_bytes = 0;
  std::string impl;
};

// m, n, k, alpha, beta, and whether it runs on one thread: inside a parallel region (a tile of a larger
// GEMM), or where the process has one thread. Such a primitive is made with OpenMP held to one thread, so
// that it is the same primitive in both places (oneDNN sizes a primitive's blocking by the threads it sees
// when it is made), and a tile's rows come out the same in a one-rank run of 2 threads and in a rank of 1
// (Note [Cutting the rows]). Both operands are packed row-major (round_part) and C is dense (ldc = n)
// whatever the caller's layout: oneDNN 2.6's AMX matmul takes neither a transposed operand nor a padded
// output (each falls back to its AVX512_BF16 GEMM, 2-5x slower), while alpha (output scales) and beta (a sum
// post-op) keep it on AMX.
using Key = std::tuple<int64_t, int64_t, int64_t, float, float, bool>;

// OpenMP held to one thread on the calling thread for a scope, where `on`.
class OneThreadScope {
 public:
  explicit OneThreadScope(bool on) : on_(on), before_(omp_get_max_threads()) {
    if (on_) omp_set_num_threads(1);
  }
  ~OneThreadScope() {
    if (on_) omp_set_num_threads(before_);
  }
  OneThreadScope(const OneThreadScope&) = delete;
  OneThreadScope& operator=(const OneThreadScope&) = delete;

 private:
  bool on_;
  int before_;
};

Matmul make_matmul(const Key& key) {
  const auto [m, n, k, alpha, beta, one_thread] = key;
  const OneThreadScope scope(one_thread);
  Matmul mm;
  const dnnl_dims_t sd{m, k}, ss{k, 1}, wd{k, n}, ws{n, 1}, dd{m, n}, ds{n, 1};
  dnnl_ok(dnnl_memory_desc_init_by_strides(&mm.src, 2, sd, dnnl_bf16, ss), "memory_desc (A)");
  dnnl_ok(dnnl_memory_desc_init_by_strides(&mm.wei, 2, wd, dnnl_bf16, ws), "memory_desc (B)");
  dnnl_ok(dnnl_memory_desc_init_by_strides(&mm.dst, 2, dd, dnnl_f32, ds), "memory_desc (C)");
  dnnl_matmul_desc_t desc;
  dnnl_ok(dnnl_matmul_desc_init(&desc, &mm.src, &mm.wei, nullptr, &mm.dst), "matmul_desc_init");
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_ok(dnnl_primitive_attr_create(&attr), "primitive_attr_create");
  dnnl_ok(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad_mode");
  if (alpha != 1.0f) dnnl_ok(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "output_scales");
  dnnl_post_ops_t ops = nullptr;
  if (beta != 0.0f) {
    dnnl_ok(dnnl_post_ops_create(&ops), "post_ops_create");
    dnnl_ok(dnnl_post_ops_append_sum(ops, beta), "post_ops_append_sum");
    dnnl_ok(dnnl_primitive_attr_set_post_ops(attr, ops), "set_post_ops");
  }
  dnnl_primitive_desc_t pd = nullptr;
  const dnnl_status_t s = dnnl_primitive_desc_create(&pd, &desc, attr, engine(), nullptr);
  if (ops) dnnl_post_ops_destroy(ops);
  dnnl_primitive_attr_destroy(attr);
  CZ_CHECK(s == dnnl_success,
           "bf16 GEMM: oneDNN has no bf16 matmul for m={} n={} k={} on this CPU (status {})", m, n, k,
           int(s));
  const char* impl = nullptr;
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  mm.impl = impl ? impl : "?";
  mm.scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  mm.scratch_bytes = dnnl_memory_desc_get_size(&mm.scratch);
  dnnl_ok(dnnl_primitive_create(&mm.prim, pd), "primitive_create");
  dnnl_primitive_desc_destroy(pd);
  return mm;
}

const Matmul& matmul_for(const Key& key) {
  static std::mutex mu;
  static std::map<Key, Matmul> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_matmul(key)).first;
  return it->second;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// A per-thread buffer that only grows.
struct Buffer {
  std::unique_ptr<char, AlignedFree> data;
  size_t bytes = 0;
  void* get(size_t want) {
    if (want > bytes) {
      want = (want + 4095) / 4096 * 4096;
      data.reset(static_cast<char*>(std::aligned_alloc(64, want)));
      CZ_CHECK(data != nullptr, "bf16 GEMM: could not allocate {} bytes for the rounded operands", want);
      bytes = want;
    }
    return data.get();
  }
};

struct ThreadState {
  dnnl_stream_t stream = nullptr;
  Buffer a, b, c, scratch;
  ThreadState() {
    dnnl_ok(dnnl_stream_create(&stream, engine(), dnnl_stream_default_flags), "stream_create");
  }
  ~ThreadState() { dnnl_stream_destroy(stream); }
};

ThreadState& thread_state() {
  thread_local ThreadState t;
  return t;
}

// Thread t of nt's share of rounding rows x cols of x (leading dimension ld) into y, packed; transposed (y is
// cols x rows) where `transpose`. oneDNN 2.6 multiplies on AMX only when both operands are plain row-major (a
// transposed operand falls back to its AVX512_BF16 GEMM), so the rounding pass also lays the operands out for
// it. Both operands are rounded in one parallel region: each region is a fork and a join, which cost most
// where cores are shared.
void round_part(const float* x, int64_t rows, int64_t cols, int64_t ld, bool transpose, uint16_t* y, int t,
                int nt) {
  if (!transpose && ld == cols) {
    const int64_t n = rows * cols;
    const int64_t b = n * t / nt / 32 * 32, e = t + 1 == nt ? n : n * (t + 1) / nt / 32 * 32;
    round_to_bf16(x + b, y + b, e - b);
    return;
  }
  if (!transpose) {
    for (int64_t r = rows * t / nt; r < rows * (t + 1) / nt; ++r)
      round_to_bf16(x + r * ld, y + r * cols, cols);
    return;
  }
  if (cpu_features().avx512_bf16 && ld <= (int64_t(1) << 31) / 64) {  // the gather's 32-bit byte offsets
    const int64_t blocks = (rows + 15) / 16;
    round_transpose_avx512(x, rows, cols, ld, y, std::min(rows, blocks * t / nt * 16),
                           std::min(rows, blocks * (t + 1) / nt * 16));
    return;
  }
  constexpr int64_t kB = 32;  // a 32 x 32 block: rounded row by row, written out column by column
  const int64_t row_blocks = (rows + kB - 1) / kB, blocks = row_blocks * ((cols + kB - 1) / kB);
  for (int64_t blk = blocks * t / nt; blk < blocks * (t + 1) / nt; ++blk) {
    const int64_t r0 = blk % row_blocks * kB, c0 = blk / row_blocks * kB;
    const int64_t nr = std::min(kB, rows - r0), nc = std::min(kB, cols - c0);
    uint16_t tile[kB][kB];
    for (int64_t r = 0; r < nr; ++r) round_to_bf16(x + (r0 + r) * ld + c0, tile[r], nc);
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t r = 0; r < nr; ++r) y[(c0 + c) * rows + r0 + r] = tile[r][c];
  }
}

void run(const Matmul& mm, void* a, void* b, float* c, ThreadState& t) {
  dnnl_engine_t e = engine();
  dnnl_memory_t mem[4] = {};
  dnnl_ok(dnnl_memory_create(&mem[0], &mm.src, e, a), "memory_create");
  dnnl_ok(dnnl_memory_create(&mem[1], &mm.wei, e, b), "memory_create");
  dnnl_ok(dnnl_memory_create(&mem[2], &mm.dst, e, c), "memory_create");
  dnnl_ok(dnnl_memory_create(&mem[3], &mm.scratch, e,
                             mm.scratch_bytes ? t.scratch.get(mm.scratch_bytes) : nullptr),
          "memory_create");
  const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]},
                                   {DNNL_ARG_WEIGHTS, mem[1]},
                                   {DNNL_ARG_DST, mem[2]},
                                   {DNNL_ARG_SCRATCHPAD, mem[3]}};
  const dnnl_status_t s = dnnl_primitive_execute(mm.prim, t.stream, 4, args);
  if (s == dnnl_success) dnnl_stream_wait(t.stream);
  for (dnnl_memory_t m : mem) dnnl_memory_destroy(m);
  dnnl_ok(s, "primitive_execute");
}

// CZ_CPU_BF16_EMULATE=1 (cpu_features.h): op(A) and op(B) rounded to bf16 and widened back to f32, then the
// f32 GEMM of the shape's library. A bf16 x bf16 product is exact in f32, so this is the bf16 GEMM up to the
// order of its f32 sums, on any CPU.
void rounded_copy(const float* x, int64_t rows, int64_t cols, int64_t ld, float* y) {
  thread_local std::vector<uint16_t> bits;
  bits.resize(size_t(cols));
  for (int64_t r = 0; r < rows; ++r) {
    round_to_bf16(x + r * ld, bits.data(), cols);
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t u = uint32_t(bits[size_t(c)]) << 16;
      std::memcpy(y + r * ld + c, &u, 4);
    }
  }
}

void gemm_emulated(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local std::vector<float> ra, rb;
  const int64_t arows = ta ? k : m, brows = tb ? n : k;
  ra.resize(size_t(arows * lda));
  rb.resize(size_t(brows * ldb));
  rounded_copy(a, arows, ta ? m : k, lda, ra.data());
  rounded_copy(b, brows, tb ? k : n, ldb, rb.data());
  sgemm(ta, tb, m, n, k, alpha, ra.data(), lda, rb.data(), ldb, beta, c, ldc);
}

}  // namespace

void round_to_bf16(const float* x, uint16_t* y, int64_t n) {
  if (n <= 0) return;
  if (cpu_features().avx512_bf16) return round_avx512(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = round_one(x[i]);
}

void set_matmul_precision(MatmulPrecision p) {
  if (p == MatmulPrecision::bf16) require_bf16(cpu_features());
  detail::matmul_precision.store(p);
}

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // no products: C = beta * C (oneDNN wants k >= 1)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (cpu_features().bf16_emulated)
    return gemm_emulated(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const bool nested = omp_in_parallel() != 0, dense = ldc == n;
  // A padded C (no caller of ours has one) goes through a dense one, with alpha and beta applied after.
  const Matmul& mm =
      matmul_for(Key{m, n, k, dense ? alpha : 1.0f, dense ? beta : 0.0f, nested || cpu_threads() <= 1});
  ThreadState& t = thread_state();
  auto* pa = static_cast<uint16_t*>(t.a.get(size_t(m * k) * 2));
  auto* pb = static_cast<uint16_t*>(t.b.get(size_t(k * n) * 2));
  const int nt = !nested && m * k + k * n >= kParallelGrain ? cpu_threads() : 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int id = omp_get_thread_num(), all = omp_get_num_threads();
    round_part(a, ta ? k : m, ta ? m : k, lda, ta, pa, id, all);
    round_part(b, tb ? n : k, tb ? k : n, ldb, tb, pb, id, all);
  }
  if (dense) return run(mm, pa, pb, c, t);
  auto* pc = static_cast<float*>(t.c.get(size_t(m * n) * 4));
  run(mm, pa, pb, pc, t);
#pragma omp parallel for schedule(static) num_threads(cpu_threads()) if (!nested && m * n >= kParallelGrain)
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    const float* pi = pc + i * n;
    if (beta == 0.0f)
      for (int64_t j = 0; j < n; ++j) ci[j] = alpha * pi[j];
    else
      for (int64_t j = 0; j < n; ++j) ci[j] = alpha * pi[j] + beta * ci[j];
  }
}

std::string bf16_gemm_engine() {
  const CpuFeatures& f = cpu_features();
  require_bf16(f);
  if (f.bf16_emulated)
    return fmt::format("emulated (f32 GEMMs of bf16-rounded operands on {}, CZ_CPU_BF16_EMULATE=1)",
                       gemm_library_name(gemm_library_for({false, true, 256, 256, 256})));
  const Matmul& mm = matmul_for(Key{256, 256, 256, 1.0f, 0.0f, false});
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("{} (oneDNN {}.{}.{} {})", bf16_isa(f), v->major, v->minor, v->patch, mm.impl);
}

}  // namespace cz::cpu
