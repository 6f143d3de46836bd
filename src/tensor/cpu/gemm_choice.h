// Which library runs each f32 GEMM shape on the CPU: one fixed library, or per shape from measurements kept
// in a per-machine cache file (Note [CPU GEMM libraries]). cz::cpu::gemm<float> (blas.h) asks sgemm() here.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tensor/cpu/gemm_libraries.h"

namespace cz::cpu {

// One GEMM as gemm<T> is called: row-major C (m x n) = op(A) (m x k) op(B) (k x n).
struct GemmShape {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  auto operator<=>(const GemmShape&) const = default;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};
std::string format_gemm_shape(const GemmShape& s);                   // "NT 8192x160x40" (ta tb m x n x k)
std::optional<GemmShape> parse_gemm_shape(const std::string& text);  // its inverse; nullopt if malformed

using GemmTable = std::map<GemmShape, GemmLibrary>;

// The library of every f32 GEMM unless told otherwise (--cpu-gemm's default), and of the shapes an auto table
// lacks: oneDNN, which measured fastest on nearly every ConvNeXt shape here (Note [CPU GEMM libraries]).
inline constexpr GemmLibrary kDefaultGemmLibrary = GemmLibrary::onednn;

// The process's choice. `fixed`: every f32 GEMM on it. Otherwise `table`'s shapes on their library and any
// other shape (a last partial batch, the row slices of linear.cpp's split weight gradient, tests) on the
// default library.
struct GemmPlan {
  std::optional<GemmLibrary> fixed = kDefaultGemmLibrary;
  GemmTable table;
};
// Set before kernels run, never while a GEMM is in flight. Until it is called, CZ_CPU_GEMM (openblas,
// onednn, blis or libxsmm; unset: kDefaultGemmLibrary) fixes the library: the tensor library's own tests use
// it.
void set_gemm_plan(GemmPlan plan);
GemmPlan gemm_plan();
GemmLibrary gemm_library_for(const GemmShape& s);

// The f32 GEMM every kernel runs (through gemm<float>): the plan's library for the shape.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The best seconds of up to `reps` timed calls of `call` after one warm-up, stopping early once `budget_s`
// (the warm-up included) is spent; at least one timed call.
double best_seconds(int reps, double budget_s, const std::function<void()>& call);

// Seconds per call of `s` on `lib` at the process's threads: the best of up to `reps` calls after one
// warm-up, stopping early once `budget_s` is spent. Operands are random, C's ld = n, A's and B's as packed.
double time_gemm(GemmLibrary lib, const GemmShape& s, int reps, double budget_s);

// The shape timed for `s` when choosing at start: its largest dimension (the batch's rows) cut until a call
// is at most 2^26 multiply-adds, no lower than 1024, so that a shape costs a few milliseconds per library.
GemmShape timing_proxy(const GemmShape& s);

// Times the proxy of `s` on every library and returns the fastest; the default library keeps a shape unless
// another one is at least 5% faster, so that noise does not flip a choice.
GemmLibrary measure_fastest(const GemmShape& s);

// What identifies a machine's measurements: the CPU model (/proc/cpuinfo), the thread count and every
// library's version. A cache entry of another key is never used.
std::string gemm_cache_key(int threads);
// $CZ_CPU_GEMM_CACHE if set, else $XDG_CACHE_HOME/convnext_zero/cpu_gemm.tsv, else
// $HOME/.cache/convnext_zero/cpu_gemm.tsv; empty where none of them is set.
std::string default_gemm_cache_path();

struct GemmChoice {
  GemmTable table;                    // every asked shape
  int measured = 0;                   // shapes timed now (the others came from the cache)
  double seconds = 0;                 // time spent measuring
  std::vector<std::string> warnings;  // a corrupt or unwritable cache file: said, then measured afresh
  bool cached = false;  // the file now holds every entry of `table` (the next process gets the same)
};
// Every shape of `shapes` from the cache file at `path` under `key`, measuring (with `measure`) those it
// lacks and adding them to the file. Holds an exclusive lock on `path`.lock throughout, so that processes of
// one machine measuring at once do not disturb each other and all end with the first writer's choice; entries
// already in the file are never replaced. The file is rewritten whole through a temporary and a rename. A
// file that does not parse is reported in `warnings` and replaced; an empty `path` measures without a cache.
GemmChoice choose_gemms(const std::vector<GemmShape>& shapes, const std::string& path, const std::string& key,
                        const std::function<GemmLibrary(const GemmShape&)>& measure = measure_fastest);

// A table as lines "SHAPE<TAB>LIBRARY" (rank 0's choice sent to the other ranks), and back; throws
// ValueError on a malformed line.
std::string format_gemm_table(const GemmTable& t);
GemmTable parse_gemm_table(const std::string& text);

// "onednn 20, openblas 12, blis 6": how many shapes each library got.
std::string summarize_gemm_table(const GemmTable& t);

}  // namespace cz::cpu
