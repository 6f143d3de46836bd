// GEMM kernels on cuBLASLt: matmul and linear forward/backward with the BIAS and BGRADB epilogues. Every
// fused path has an unfused fallback (plain GEMM + our own kernels) taken when cuBLASLt offers no algorithm
// for it or epilogues are switched off (DeviceContext::set_gemm_epilogues).
#include <climits>

#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"

namespace cz::cuda {
namespace {

// Note [Row-major GEMMs]
// cuBLAS is column-major; our tensors are row-major. A row-major (r x c) matrix with leading dimension c is
// the column-major (c x r) matrix with the same bytes, i.e. its transpose. So the row-major product
// Y = X W^T is computed as the column-major Y^T = W X^T: every GEMM below names its operands in column-major
// terms (m, n, k are the column-major D's rows, columns and the inner size), which swaps A and B relative to
// the row-major formula. Bias vectors index D's column-major rows (m), i.e. the row-major columns: features.

struct Gemm {
  DType dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // stored (trans_a ? k x m : m x k), column-major
  int64_t lda = 0;
  const void* b = nullptr;  // stored (trans_b ? n x k : k x n)
  int64_t ldb = 0;
  void* d = nullptr;  // m x n
  int64_t ldd = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;  // DEFAULT, BIAS or BGRADB
  const void* bias = nullptr;                               // BIAS: length m
  void* bias_grad = nullptr;                                // BGRADB: length n (sums over k of op(B))
};

struct LtTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

LtTypes lt_types(DType t, bool tf32) {
  switch (t) {
    case DType::f32:
      return {CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::bf16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    default:
      throw DtypeError(fmt::format("cuda GEMM: f32, f64, f16 or bf16 expected, got {}", dtype_name(t)));
  }
}

// The largest power of two up to 256 that divides the address and the byte size of a column, i.e. the
// alignment every column of the matrix starts at. cuBLASLt picks kernels by these (MIN_ALIGNMENT prefs).
uint32_t alignment_of(const void* p, int64_t ld, size_t elem) {
  uint32_t a = 256;
  while (a > 1 && ((reinterpret_cast<uintptr_t>(p) % a) != 0 || (uint64_t(ld) * elem) % a != 0)) a >>= 1;
  return a;
}

uint32_t pointer_alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a >>= 1;
  return a;
}

// RAII for cuBLASLt descriptors; destruction never throws.
struct MatmulDesc {
  cublasLtMatmulDesc_t h = nullptr;
  ~MatmulDesc() {
    if (h) (void)cublasLtMatmulDescDestroy(h);
  }
  template <class V>
  void set(cublasLtMatmulDescAttributes_t attr, const V& v) {
    CZ_CHECK_STATUS(cublasLtMatmulDescSetAttribute(h, attr, &v, sizeof(v)));
  }
};
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  ~Layout() {
    if (h) (void)cublasLtMatrixLayoutDestroy(h);
  }
};
struct Preference {
  cublasLtMatmulPreference_t h = nullptr;
  ~Preference() {
    if (h) (void)cublasLtMatmulPreferenceDestroy(h);
  }
  template <class V>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
    CZ_CHECK_STATUS(cublasLtMatmulPreferenceSetAttribute(h, attr, &v, sizeof(v)));
  }
};

// Runs g on cuBLASLt with its epilogue. False when cuBLASLt has no algorithm for the problem (the caller
// falls back); throws on any other failure.
bool try_lt(const Gemm& g, Stream stream) {
  DeviceContext& ctx = context(stream.device.index);
  const LtTypes types = lt_types(g.dtype, ctx.allow_tf32());
  const size_t elem = dtype_size(g.dtype);
  MatmulDesc op;
  CZ_CHECK_STATUS(cublasLtMatmulDescCreate(&op.h, types.compute, types.scale));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                          tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  op.set(CUBLASLT_MATMUL_DESC_TRANSA, ta);
  op.set(CUBLASLT_MATMUL_DESC_TRANSB, tb);
  if (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT) op.set(CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  if (g.bias) op.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.bias_grad) op.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias_grad);

  Layout la, lb, ld;
  CZ_CHECK_STATUS(cublasLtMatrixLayoutCreate(&la.h, types.data, uint64_t(g.trans_a ? g.k : g.m),
                                             uint64_t(g.trans_a ? g.m : g.k), g.lda));
  CZ_CHECK_STATUS(cublasLtMatrixLayoutCreate(&lb.h, types.data, uint64_t(g.trans_b ? g.n : g.k),
                                             uint64_t(g.trans_b ? g.k : g.n), g.ldb));
  CZ_CHECK_STATUS(cublasLtMatrixLayoutCreate(&ld.h, types.data, uint64_t(g.m), uint64_t(g.n), g.ldd));

  const uint32_t align_a = alignment_of(g.a, g.lda, elem), align_b = alignment_of(g.b, g.ldb, elem),
                 align_d = alignment_of(g.d, g.ldd, elem);
  const void* vec = g.bias ? g.bias : g.bias_grad;
  const uint32_t align_vec = vec ? pointer_alignment(vec) : 0;

  auto lease = ctx.cublaslt(stream);
  const std::string key =
      fmt::format("{} {} {}{} {} {} {} {} {} {} {} {} {} {} {}", int(types.data), int(types.compute),
                  int(g.trans_a), int(g.trans_b), g.m, g.n, g.k, g.lda, g.ldb, g.ldd, int(g.epilogue),
                  align_a, align_b, align_d, align_vec);
  auto it = lease.algos->find(key);
  if (it == lease.algos->end()) {
    Preference pref;
    CZ_CHECK_STATUS(cublasLtMatmulPreferenceCreate(&pref.h));
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(lease.workspace_bytes));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lease.handle, op.h, la.h, lb.h, ld.h, ld.h,
                                                             pref.h, 1, &result, &found);
    LtAlgo algo;
    // An epilogue cuBLASLt cannot do for these types may be refused as NOT_SUPPORTED or as INVALID_VALUE:
    // either way the unfused path computes the same thing. A plain GEMM must not be refused as invalid.
    const bool no_algo = st == CUBLAS_STATUS_NOT_SUPPORTED ||
                         (st == CUBLAS_STATUS_INVALID_VALUE && g.epilogue != CUBLASLT_EPILOGUE_DEFAULT);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      algo = {true, result.algo, result.workspaceSize};
    } else if (st != CUBLAS_STATUS_SUCCESS && !no_algo) {
      CZ_CHECK_STATUS(st);
    }
    it = lease.algos->emplace(key, algo).first;
  }
  if (!it->second.found) return false;
  CZ_ASSERT(it->second.workspace_bytes <= lease.workspace_bytes,
            "cuBLASLt algorithm wants {} bytes of workspace", it->second.workspace_bytes);

  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = types.scale == CUDA_R_64F;
  const cublasStatus_t st =
      cublasLtMatmul(lease.handle, op.h, f64 ? static_cast<const void*>(&one_d) : &one_f, g.a, la.h, g.b,
                     lb.h, f64 ? static_cast<const void*>(&zero_d) : &zero_f, g.d, ld.h, g.d, ld.h,
                     &it->second.algo, lease.workspace, lease.workspace_bytes, native(stream));
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    it->second.found = false;  // do not ask again
    return false;
  }
  CZ_CHECK_STATUS(st);
  return true;
}

// Plain D = op(A) op(B) through the classic cuBLAS API, for problems cuBLASLt has no algorithm for.
void gemm_ex(const Gemm& g, Stream stream) {
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldd})
    CZ_CHECK_SHAPE(v <= INT_MAX, "cuda GEMM: dimension {} too large for cublasGemmEx (m={}, n={}, k={})", v,
                   g.m, g.n, g.k);
  DeviceContext& ctx = context(stream.device.index);
  const LtTypes types = lt_types(g.dtype, ctx.allow_tf32());
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = types.scale == CUDA_R_64F;
  auto lease = ctx.cublas(stream);
  CZ_CHECK_STATUS(cublasGemmEx(lease.handle, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                               g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, int(g.m), int(g.n), int(g.k),
                               f64 ? static_cast<const void*>(&one_d) : &one_f, g.a, types.data, int(g.lda),
                               g.b, types.data, int(g.ldb), f64 ? static_cast<const void*>(&zero_d) : &zero_f,
                               g.d, types.data, int(g.ldd), types.compute, CUBLAS_GEMM_DEFAULT));
}

// Runs g: fused when possible, else a plain GEMM into D plus our kernels for the epilogue. D must be dense
// (ldd == m).
void run(const Gemm& g, Stream stream) {
  CZ_ASSERT(g.ldd == g.m, "cuda GEMM: D must be dense");
  const bool empty = g.m == 0 || g.n == 0 || g.k == 0;
  DeviceContext& ctx = context(stream.device.index);
  GemmCounters& counters = ctx.gemm_counters();
  if (!empty && (g.epilogue == CUBLASLT_EPILOGUE_DEFAULT || ctx.gemm_epilogues()) && try_lt(g, stream)) {
    ++counters.lt;
    return;
  }
  if (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT) ++counters.epilogue_fallbacks;

  // Unfused: the GEMM proper into D (zeros when k == 0).
  Gemm plain = g;
  plain.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  plain.bias = nullptr;
  plain.bias_grad = nullptr;
  // A plain g reaches this point only when cuBLASLt just refused it: straight to cublasGemmEx then.
  if (g.m > 0 && g.n > 0) {
    if (g.k == 0) {
      CZ_CHECK_STATUS(
          cudaMemsetAsync(plain.d, 0, size_t(g.m) * size_t(g.n) * dtype_size(g.dtype), native(stream)));
    } else if (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT && try_lt(plain, stream)) {
      ++counters.lt;
    } else {
      ++counters.gemm_ex;
      gemm_ex(plain, stream);
    }
  }
  const launch::Config cfg = detail::config_of(stream);
  // In row-major terms D is (n rows x m columns): the bias runs along its columns.
  if (g.bias) CZ_CHECK_STATUS(launch::add_bias(cfg, g.dtype, g.d, g.bias, g.n, g.m));
  if (g.bias_grad) {
    // op(B) is (k x n); stored transposed (n x k column-major) it is row-major (k x n): sum its rows.
    CZ_ASSERT(g.trans_b && g.ldb == g.n, "BGRADB fallback needs B stored as a dense row-major (k x n)");
    DataPtr ws = allocate(launch::column_sums_workspace(g.dtype, g.k, g.n, cfg.sm_count), stream);
    CZ_CHECK_STATUS(launch::column_sums(cfg, g.dtype, g.b, nullptr, g.k, g.n, g.bias_grad, ws.get()));
  }
}

void check_gemm_operand(const char* op, const char* what, const Tensor& t, DType dtype, Stream stream,
                        int64_t rows, int64_t cols) {
  detail::check_operand(op, what, t, dtype, stream);
  CZ_CHECK_SHAPE(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols,
                 "cuda::{}: {} has shape {}, expected ({}, {})", op, what, shape_str(t.sizes()), rows, cols);
}

void check_vector(const char* op, const char* what, const Tensor& t, DType dtype, Stream stream, int64_t n) {
  detail::check_operand(op, what, t, dtype, stream);
  CZ_CHECK_SHAPE(t.numel() == n, "cuda::{}: {} has shape {}, expected ({})", op, what, shape_str(t.sizes()),
                 n);
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& out, Stream stream) {
  detail::check_float("matmul", "a", a);
  const DType t = a.dtype();
  CZ_CHECK_SHAPE(a.dim() == 2 && b.dim() == 2, "cuda::matmul: a {} and b {} must be 2-d",
                 shape_str(a.sizes()), shape_str(b.sizes()));
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  check_gemm_operand("matmul", "a", a, t, stream, m, k);
  check_gemm_operand("matmul", "b", b, t, stream, k, n);
  check_gemm_operand("matmul", "out", out, t, stream, m, n);
  DeviceGuard guard(stream.device.index);
  Gemm g;  // out^T (n x m) = b^T a^T: Note [Row-major GEMMs]
  g.dtype = t;
  g.m = n, g.n = m, g.k = k;
  g.a = b.raw_data(), g.lda = n;
  g.b = a.raw_data(), g.ldb = k;
  g.d = out.raw_data(), g.ldd = n;
  run(g, stream);
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, Stream stream) {
  const char* op = "linear_forward";
  detail::check_float(op, "x", x);
  const DType t = x.dtype();
  CZ_CHECK_SHAPE(x.dim() == 2 && w.dim() == 2, "cuda::{}: x {} and w {} must be 2-d", op,
                 shape_str(x.sizes()), shape_str(w.sizes()));
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  check_gemm_operand(op, "x", x, t, stream, rows, in);
  check_gemm_operand(op, "w", w, t, stream, out, in);
  check_gemm_operand(op, "y", y, t, stream, rows, out);
  if (bias.defined()) check_vector(op, "bias", bias, t, stream, out);
  DeviceGuard guard(stream.device.index);
  Gemm g;  // y^T (out x rows) = w x^T: Note [Row-major GEMMs]
  g.dtype = t;
  g.trans_a = true;
  g.m = out, g.n = rows, g.k = in;
  g.a = w.raw_data(), g.lda = in;
  g.b = x.raw_data(), g.ldb = in;
  g.d = y.raw_data(), g.ldd = out;
  if (bias.defined()) {
    g.epilogue = CUBLASLT_EPILOGUE_BIAS;
    g.bias = bias.raw_data();
  }
  run(g, stream);
}

void linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db,
                     Stream stream) {
  const char* op = "linear_backward";
  detail::check_float(op, "gy", gy);
  const DType t = gy.dtype();
  CZ_CHECK_SHAPE(x.dim() == 2 && w.dim() == 2, "cuda::{}: x {} and w {} must be 2-d", op,
                 shape_str(x.sizes()), shape_str(w.sizes()));
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  check_gemm_operand(op, "gy", gy, t, stream, rows, out);
  check_gemm_operand(op, "x", x, t, stream, rows, in);
  check_gemm_operand(op, "w", w, t, stream, out, in);
  if (dx.defined()) check_gemm_operand(op, "dx", dx, t, stream, rows, in);
  if (dw.defined()) check_gemm_operand(op, "dw", dw, t, stream, out, in);
  if (db.defined()) check_vector(op, "db", db, t, stream, out);
  DeviceGuard guard(stream.device.index);
  if (dx.defined()) {  // dx^T (in x rows) = w^T gy^T
    Gemm g;
    g.dtype = t;
    g.m = in, g.n = rows, g.k = out;
    g.a = w.raw_data(), g.lda = in;
    g.b = gy.raw_data(), g.ldb = out;
    g.d = dx.raw_data(), g.ldd = in;
    run(g, stream);
  }
  if (dw.defined()) {  // dw^T (in x out) = x^T gy, and db from op(B) = gy
    Gemm g;
    g.dtype = t;
    g.trans_b = true;
    g.m = in, g.n = out, g.k = rows;
    g.a = x.raw_data(), g.lda = in;
    g.b = gy.raw_data(), g.ldb = out;
    g.d = dw.raw_data(), g.ldd = in;
    if (db.defined()) {
      g.epilogue = CUBLASLT_EPILOGUE_BGRADB;
      g.bias_grad = db.raw_data();
    }
    run(g, stream);
  } else if (db.defined()) {
    const launch::Config cfg = detail::config_of(stream);
    DataPtr ws = allocate(launch::column_sums_workspace(t, rows, out, cfg.sm_count), stream);
    CZ_CHECK_STATUS(launch::column_sums(cfg, t, gy.raw_data(), nullptr, rows, out, db.raw_data(), ws.get()));
  }
}

}  // namespace cz::cuda
