// The CPU GEMM library per shape: the process's plan, timing, and the per-machine cache file.
#include "tensor/cpu/gemm_choice.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <sstream>

#include <fmt/format.h>

#include "tensor/check.h"
#include "tensor/parallel.h"

namespace cz::cpu {

// Note [CPU GEMM libraries]: every f32 GEMM of the CPU backend goes through gemm<float> (blas.h) to sgemm()
// here, which runs it on one of four libraries: OpenBLAS (SkylakeX kernels here), oneDNN 2.6 (dnnl_sgemm, its
// JIT AVX-512 kernels), BLIS 0.9 (bli_sgemm_ex; Debian's build picks its Haswell kernels) or libxsmm 1.17
// (its JIT small-matrix kernels on 64x64 tiles of C of ours, as libxsmm hands a large GEMM to the BLAS it is
// linked with). f64 (the gradient checks) stays on OpenBLAS. Each one, called inside an OpenMP parallel
// region, runs on the calling thread, so kernels may split work themselves (linear.cpp's row-split weight
// gradient).
//
// The default is oneDNN for every shape (--cpu-gemm onednn), a fixed rule the measurements justify: over the
// 38 GEMMs of a ConvNeXt-atto step (64 px, batch 32, bench/bench_gemm_cpu, 2 threads of this project's Xeon)
// it was the fastest on 31, and the step's GEMMs took 29.0 ms on it against 28.3 ms on the fastest library of
// each shape, 38.6 on OpenBLAS, 41.1 on libxsmm and 46.0 on BLIS (docs/performance.md). A fixed library also
// keeps a run repeatable anywhere: its choice is a function of nothing measured (as Note [Reproducible runs]
// for CUDA).
//
// --cpu-gemm auto picks per shape, as cuDNN's benchmark mode does for convolutions: at start the trainer
// lists the step's GEMM shapes from the model config, image size and micro-batch (nn/convnext_gemms.h) and
// takes each one's library from a cache file kept per machine, measuring only shapes the file lacks; shapes
// outside the list (a last partial batch, the row slices of linear.cpp's split weight gradient) run on the
// default. What keeps it reproducible:
//   - an entry's key is the CPU model, the thread count and the four libraries' versions, so a machine with
//     another CPU, thread count or libraries measures afresh instead of inheriting;
//   - the file is read, measured into and written under an exclusive lock, and an entry once written is never
//     replaced: processes starting at once end with the same choice, the first writer's;
//   - rank 0 chooses and sends its table to every rank, so all ranks run a shape on the same library;
//   - where no cache can be kept the run stays on the default library, since a choice no later process could
//     find again would make a resumed run differ;
//   - the default keeps a shape unless another library is at least 5% faster, so noise does not flip it.
// Each shape is timed on a proxy with its batch rows cut to at most 2^26 multiply-adds (a few ms a library;
// the header says how many shapes were measured and how long it took). Such short timings are at the mercy
// of a busy machine: on this shared 2-core VM the cached picks cost 72 ms where oneDNN alone took 61, which
// is why auto is not the default. A cache file that does not parse is reported and replaced by fresh
// measurements (writes go through a temporary and a rename, so a crash cannot leave half a file).

namespace {

std::shared_mutex& plan_mutex() {
  static std::shared_mutex m;
  return m;
}

GemmPlan initial_plan() {
  GemmPlan p;
  if (const char* env = std::getenv("CZ_CPU_GEMM"); env && *env) {
    const auto lib = parse_gemm_library(env);
    CZ_CHECK(lib.has_value(), "CZ_CPU_GEMM must be openblas, onednn, blis or libxsmm, got '{}'", env);
    p.fixed = *lib;
  }
  return p;
}

GemmPlan& plan_storage() {
  static GemmPlan p = initial_plan();
  return p;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0)
      if (auto colon = line.find(':'); colon != std::string::npos) return trim(line.substr(colon + 1));
  return "unknown CPU";
}

// The cache file: "# ..." comments, then "KEY<TAB>SHAPE<TAB>LIBRARY" lines. Throws ValueError naming the line
// that does not parse.
using CacheEntries = std::map<std::string, GemmTable>;

CacheEntries parse_cache(const std::string& text, const std::string& path) {
  CacheEntries out;
  std::istringstream in(text);
  int no = 0;
  for (std::string line; std::getline(in, line);) {
    ++no;
    if (line.empty() || line[0] == '#') continue;
    const size_t t1 = line.find('\t'), t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    CZ_CHECK(t2 != std::string::npos && line.find('\t', t2 + 1) == std::string::npos,
             "{} line {}: expected KEY<TAB>SHAPE<TAB>LIBRARY, got '{}'", path, no, line);
    const auto shape = parse_gemm_shape(line.substr(t1 + 1, t2 - t1 - 1));
    const auto lib = parse_gemm_library(line.substr(t2 + 1));
    CZ_CHECK(shape && lib, "{} line {}: bad shape or library in '{}'", path, no, line);
    out[line.substr(0, t1)][*shape] = *lib;
  }
  return out;
}

std::string format_cache(const CacheEntries& entries) {
  std::string s =
      "# convnext_zero: the CPU GEMM library measured fastest per shape on this machine (Note [CPU GEMM "
      "libraries]);\n# KEY<TAB>SHAPE<TAB>LIBRARY. Delete this file to measure again.\n";
  for (const auto& [key, table] : entries)
    for (const auto& [shape, lib] : table)
      s += fmt::format("{}\t{}\t{}\n", key, format_gemm_shape(shape), gemm_library_name(lib));
  return s;
}

struct FileLock {
  int fd = -1;
  explicit FileLock(const std::string& path) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && ::flock(fd, LOCK_EX) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~FileLock() {
    if (fd >= 0) ::close(fd);  // closing releases the lock
  }
};

}  // namespace

std::string format_gemm_shape(const GemmShape& s) {
  return fmt::format("{}{} {}x{}x{}", s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k);
}

std::optional<GemmShape> parse_gemm_shape(const std::string& text) {
  GemmShape s;
  char a = 0, b = 0;
  long long m = 0, n = 0, k = 0;
  int used = 0;
  if (std::sscanf(text.c_str(), "%c%c %lldx%lldx%lld%n", &a, &b, &m, &n, &k, &used) != 5 ||
      size_t(used) != text.size())
    return std::nullopt;
  if ((a != 'N' && a != 'T') || (b != 'N' && b != 'T') || m <= 0 || n <= 0 || k <= 0) return std::nullopt;
  s.ta = a == 'T', s.tb = b == 'T', s.m = m, s.n = n, s.k = k;
  return s;
}

void set_gemm_plan(GemmPlan plan) {
  std::unique_lock lock(plan_mutex());
  plan_storage() = std::move(plan);
}

GemmPlan gemm_plan() {
  std::shared_lock lock(plan_mutex());
  return plan_storage();
}

GemmLibrary gemm_library_for(const GemmShape& s) {
  std::shared_lock lock(plan_mutex());
  const GemmPlan& p = plan_storage();
  if (p.fixed) return *p.fixed;
  const auto it = p.table.find(s);
  return it == p.table.end() ? kDefaultGemmLibrary : it->second;
}

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm_on(gemm_library_for({ta, tb, m, n, k}), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

double best_seconds(int reps, double budget_s, const std::function<void()>& call) {
  using Clock = std::chrono::steady_clock;
  const auto timed = [&] {
    const auto t0 = Clock::now();
    call();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  double spent = timed(), best = 1e30;  // the warm-up: JIT, packing buffers, thread start
  for (int r = 0; r < reps && (r == 0 || spent < budget_s); ++r) {
    const double t = timed();
    best = std::min(best, t);
    spent += t;
  }
  return best;
}

double time_gemm(GemmLibrary lib, const GemmShape& s, int reps, double budget_s) {
  const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  std::vector<float> a(size_t(s.m * s.k)), b(size_t(s.k * s.n)), c(size_t(s.m * s.n), 0.f);
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : a) v = u(gen);
  for (float& v : b) v = u(gen);
  return best_seconds(reps, budget_s, [&] {
    sgemm_on(lib, s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), s.n);
  });
}

GemmShape timing_proxy(const GemmShape& s) {
  GemmShape p = s;
  constexpr double kMaxMacs = double(int64_t(1) << 26);
  while (double(p.m) * double(p.n) * double(p.k) > kMaxMacs) {
    int64_t* big = &p.m;
    if (p.n > *big) big = &p.n;
    if (p.k > *big) big = &p.k;
    if (*big <= 1024) break;
    *big = std::max<int64_t>(1024, *big / 2);
  }
  return p;
}

GemmLibrary measure_fastest(const GemmShape& s) {
  const GemmShape proxy = timing_proxy(s);
  GemmLibrary best = kDefaultGemmLibrary;
  const double base = time_gemm(kDefaultGemmLibrary, proxy, 3, 0.004);
  double best_t = base;
  for (GemmLibrary lib : kGemmLibraries) {
    if (lib == kDefaultGemmLibrary) continue;
    const double t = time_gemm(lib, proxy, 3, 0.004);
    if (t < best_t && t < 0.95 * base) best = lib, best_t = t;
  }
  return best;
}

std::string gemm_cache_key(int threads) {
  std::string key = fmt::format("{}; {} threads", cpu_model(), threads);
  for (GemmLibrary lib : kGemmLibraries) key += "; " + gemm_library_version(lib);
  for (char& ch : key)
    if (ch == '\t' || ch == '\n') ch = ' ';
  return key;
}

std::string default_gemm_cache_path() {
  if (const char* p = std::getenv("CZ_CPU_GEMM_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/convnext_zero/cpu_gemm.tsv";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.cache/convnext_zero/cpu_gemm.tsv";
  return "";
}

GemmChoice choose_gemms(const std::vector<GemmShape>& shapes, const std::string& path, const std::string& key,
                        const std::function<GemmLibrary(const GemmShape&)>& measure) {
  namespace fs = std::filesystem;
  GemmChoice out;
  const auto t0 = std::chrono::steady_clock::now();
  auto measure_missing = [&](GemmTable& have) {
    for (const GemmShape& s : shapes)
      if (!have.count(s)) {
        have[s] = measure(s);
        ++out.measured;
      }
  };
  auto finish = [&](const GemmTable& have) {
    for (const GemmShape& s : shapes) out.table[s] = have.at(s);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  };
  if (path.empty()) {
    GemmTable fresh;
    measure_missing(fresh);
    return finish(fresh);
  }
  std::error_code ec;
  if (const fs::path dir = fs::path(path).parent_path(); !dir.empty()) fs::create_directories(dir, ec);
  FileLock lock(path + ".lock");
  if (lock.fd < 0)
    out.warnings.push_back(fmt::format("cannot lock {}.lock; measuring without the cache", path));
  CacheEntries entries;
  if (std::ifstream in(path, std::ios::binary); in) {
    std::stringstream text;
    text << in.rdbuf();
    try {
      entries = parse_cache(text.str(), path);
    } catch (const ValueError& e) {
      out.warnings.push_back(
          fmt::format("the CPU GEMM cache {} is corrupt ({}); measuring again and "
                      "replacing it",
                      path, e.what()));
      entries.clear();
    }
  }
  GemmTable& have = entries[key];
  const int before = out.measured;
  measure_missing(have);
  out.cached = lock.fd >= 0;
  if (lock.fd >= 0 && (out.measured > before || !out.warnings.empty())) {
    const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
    bool ok = false;
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << format_cache(entries);
      ok = bool(f.flush());
    }
    if (ok) {
      fs::rename(tmp, path, ec);
      ok = !ec;
    }
    if (!ok) {
      out.cached = false;
      fs::remove(tmp, ec);
      out.warnings.push_back(
          fmt::format("cannot write the CPU GEMM cache {}; the choice is this run's only", path));
    }
  }
  return finish(have);
}

std::string format_gemm_table(const GemmTable& t) {
  std::string s;
  for (const auto& [shape, lib] : t)
    s += fmt::format("{}\t{}\n", format_gemm_shape(shape), gemm_library_name(lib));
  return s;
}

GemmTable parse_gemm_table(const std::string& text) {
  GemmTable t;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const size_t tab = line.find('\t');
    const auto shape = tab == std::string::npos ? std::nullopt : parse_gemm_shape(line.substr(0, tab));
    const auto lib = tab == std::string::npos ? std::nullopt : parse_gemm_library(line.substr(tab + 1));
    CZ_CHECK(shape && lib, "a CPU GEMM table line must be SHAPE<TAB>LIBRARY, got '{}'", line);
    t[*shape] = *lib;
  }
  return t;
}

std::string summarize_gemm_table(const GemmTable& t) {
  std::map<GemmLibrary, int> count;
  for (const auto& [shape, lib] : t) ++count[lib];
  std::vector<std::pair<int, GemmLibrary>> order;
  for (const auto& [lib, n] : count) order.push_back({-n, lib});
  std::sort(order.begin(), order.end());
  std::string s;
  for (const auto& [n, lib] : order)
    s += fmt::format("{}{} {}", s.empty() ? "" : ", ", gemm_library_name(lib), -n);
  return s;
}

}  // namespace cz::cpu
