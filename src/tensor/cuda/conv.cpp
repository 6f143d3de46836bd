// The ConvNeXt convolutions on cuDNN, NHWC: depthwise k x k (grouped, groups = C, padding k/2; our direct
// kernels where cuDNN has no algorithm) and patchify (kernel = stride, no padding); forward, backward-data
// and backward-filter, with algorithms chosen once per problem and cached in the device context; one GEMM
// over the patches where cuDNN has none for patchify.
#include <algorithm>
#include <string>
#include <vector>

#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"
#include "tensor/patches.h"
#include "tensor/stream.h"

namespace cz::cuda {
namespace {

// Note [Convolution algorithms]: for every (op, direction, dtype, shape, groups, math) problem the first call
// asks cuDNN for candidates, cudnnGet*_v7 (heuristics, no device work) by default or cudnnFind*Ex (each
// candidate timed once, synchronising the device) under the device's conv_benchmark switch with
// reproducible off (Note [Reproducible runs] in context.h: a timed choice can differ from one process to the
// next, and two deterministic algorithms still round differently). It keeps those
// that succeeded, fit kMaxWorkspace and, for f32 without TF32, need no tensor-op math (and runs them with FMA
// math), and deterministic (no atomics, so training repeats bit for bit). It then runs them in that order
// until cuDNN accepts one (heuristic candidates are not always runnable) and caches that one, or "none":
// depthwise then takes our direct kernels, patchify one GEMM over its patches (Note [Patchify as a GEMM]).
// The choice lives in the DeviceContext with the per-stream workspace it needs, which only grows.
constexpr size_t kMaxWorkspace = size_t(256) << 20;

enum class Dir { fwd, bwd_data, bwd_filter };

template <class Create, class Destroy, class H>
struct Desc {
  H h{};
  Desc() { CZ_CHECK_STATUS(Create{}(&h)); }
  ~Desc() { Destroy{}(h); }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
};
struct CreateT {
  cudnnStatus_t operator()(cudnnTensorDescriptor_t* h) const { return cudnnCreateTensorDescriptor(h); }
};
struct DestroyT {
  void operator()(cudnnTensorDescriptor_t h) const { cudnnDestroyTensorDescriptor(h); }
};
struct CreateF {
  cudnnStatus_t operator()(cudnnFilterDescriptor_t* h) const { return cudnnCreateFilterDescriptor(h); }
};
struct DestroyF {
  void operator()(cudnnFilterDescriptor_t h) const { cudnnDestroyFilterDescriptor(h); }
};
struct CreateC {
  cudnnStatus_t operator()(cudnnConvolutionDescriptor_t* h) const {
    return cudnnCreateConvolutionDescriptor(h);
  }
};
struct DestroyC {
  void operator()(cudnnConvolutionDescriptor_t h) const { cudnnDestroyConvolutionDescriptor(h); }
};
using TensorDesc = Desc<CreateT, DestroyT, cudnnTensorDescriptor_t>;
using FilterDesc = Desc<CreateF, DestroyF, cudnnFilterDescriptor_t>;
using ConvDesc = Desc<CreateC, DestroyC, cudnnConvolutionDescriptor_t>;

cudnnDataType_t dnn_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f64:
      return CUDNN_DATA_DOUBLE;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw DtypeError(
          fmt::format("cuda conv: cuDNN convolutions take f32, f64, f16 or bf16, got {}", dtype_name(t)));
  }
}

int to_int(const char* op, int64_t v) {
  CZ_CHECK_SHAPE(v >= 0 && v <= 0x7fffffff, "cuda::{}: size {} does not fit cuDNN's int dimensions", op, v);
  return int(v);
}

// One convolution problem: x (n, h, w, c) NHWC, filter (k, r, r, c / groups) KRSC (cuDNN's NHWC filter
// format), y (n, ho, wo, k).
struct Problem {
  const char* op;
  DType dtype;
  int n, h, w, c, k, r, pad, stride, groups, ho, wo;
  // The device's switches (Note [Backend switches]), set by try_run: TF32 allowed, timed search.
  bool tf32 = false, search = false;

  // Everything the choice depends on. The device is not in it: each device has its own cache. Strides are
  // not: every operand is contiguous NHWC. TF32 is, through the math type.
  std::string key(Dir dir, cudnnMathType_t math) const {
    return fmt::format("{}|{}|{}|{}x{}x{}x{}|{}x{}|p{}s{}g{}|m{}|b{}", op, int(dir), dtype_name(dtype), n, h,
                       w, c, k, r, pad, stride, groups, int(math), int(search));
  }
};

// The descriptors of a problem, with the math type the dtype calls for.
struct Descs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  cudnnMathType_t math;

  explicit Descs(const Problem& p) {
    const cudnnDataType_t t = dnn_type(p.dtype);
    CZ_CHECK_STATUS(cudnnSetTensor4dDescriptor(x.h, CUDNN_TENSOR_NHWC, t, p.n, p.c, p.h, p.w));
    CZ_CHECK_STATUS(cudnnSetTensor4dDescriptor(y.h, CUDNN_TENSOR_NHWC, t, p.n, p.k, p.ho, p.wo));
    CZ_CHECK_STATUS(cudnnSetFilter4dDescriptor(w.h, t, CUDNN_TENSOR_NHWC, p.k, p.c / p.groups, p.r, p.r));
    // 16-bit data accumulates in f32 (the compute type of the convolution descriptor); f64 in f64.
    const cudnnDataType_t compute = p.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    CZ_CHECK_STATUS(cudnnSetConvolution2dDescriptor(conv.h, p.pad, p.pad, p.stride, p.stride, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, compute));
    CZ_CHECK_STATUS(cudnnSetConvolutionGroupCount(conv.h, p.groups));
    // f32 without TF32 must match the CPU to ~1e-6: FMA math only.
    math = p.dtype == DType::f32   ? (p.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH)
           : p.dtype == DType::f64 ? CUDNN_DEFAULT_MATH
                                   : CUDNN_TENSOR_OP_MATH;
    CZ_CHECK_STATUS(cudnnSetConvolutionMathType(conv.h, math));
  }
};

// Whether cuDNN refused to run an algorithm (nothing queued; the next candidate may run). cuDNN 9 refuses
// with sub-codes of CUDNN_STATUS_NOT_SUPPORTED (_SHAPE, _LAYOUT, _DATA_TYPE, ...), so a refusal is
// recognised by its category, not by equality with the bare code; a kernel that needs more alignment than
// the operands have is a refusal too.
bool refused(cudnnStatus_t st) {
#if CUDNN_MAJOR >= 9
  return CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED ||
         st == CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER;
#else
  return st == CUDNN_STATUS_NOT_SUPPORTED;
#endif
}

template <class Perf>
bool acceptable(const Perf& perf, const Problem& p) {
  if (perf.status != CUDNN_STATUS_SUCCESS || perf.memory > kMaxWorkspace) return false;
  if (perf.determinism != CUDNN_DETERMINISTIC) return false;
  if (p.dtype == DType::f32 && !p.tf32 &&
      (perf.mathType == CUDNN_TENSOR_OP_MATH || perf.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
    return false;
  return true;
}

// The math type a candidate runs with. f32 without TF32 always runs with FMA math: a candidate reported with
// CUDNN_DEFAULT_MATH would otherwise be run with DEFAULT, which permits TF32 tensor cores on Ampere and
// later.
cudnnMathType_t run_math(const Problem& p, cudnnMathType_t reported) {
  return p.dtype == DType::f32 && !p.tf32 ? CUDNN_FMA_MATH : reported;
}

constexpr int kMaxCandidates = 16;

// Operands of one run: device pointers (filter in KRSC) and the stream.
struct Operands {
  const void* x;
  const void* w;
  const void* y;  // gy for the backward directions
  void* out;      // y, dx or dw
};

// The workspace `algo` needs with the descriptor's current math type; cuDNN's refusal is returned as is.
cudnnStatus_t workspace_size(cudnnHandle_t h, const Descs& d, Dir dir, int algo, size_t* bytes) {
  switch (dir) {
    case Dir::fwd:
      return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.h, d.w.h, d.conv.h, d.y.h,
                                                     cudnnConvolutionFwdAlgo_t(algo), bytes);
    case Dir::bwd_data:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w.h, d.y.h, d.conv.h, d.x.h,
                                                          cudnnConvolutionBwdDataAlgo_t(algo), bytes);
    case Dir::bwd_filter:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.h, d.y.h, d.conv.h, d.w.h,
                                                            cudnnConvolutionBwdFilterAlgo_t(algo), bytes);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// The usable candidates in cuDNN's order (deterministic ones only: both convolutions have a deterministic
// path of our own to fall back on), each with the math type it runs with and the larger of the workspace the
// query reported and the one cudnnGet*WorkspaceSize gives for that math type (heuristic estimates are not
// promised to be exact). Leaves the descriptor's math type changed.
template <class Perf>
std::vector<ConvAlgo> usable(const Perf* perfs, int count, const Problem& p, cudnnHandle_t h, const Descs& d,
                             Dir dir) {
  std::vector<ConvAlgo> out;
  for (int i = 0; i < count; ++i) {
    if (!acceptable(perfs[i], p)) continue;
    ConvAlgo a{true, int(perfs[i].algo), run_math(p, perfs[i].mathType), perfs[i].memory};
    size_t bytes = 0;
    if (cudnnSetConvolutionMathType(d.conv.h, a.math) == CUDNN_STATUS_SUCCESS &&
        workspace_size(h, d, dir, a.algo, &bytes) == CUDNN_STATUS_SUCCESS)
      a.workspace_bytes = std::max(a.workspace_bytes, bytes);
    if (a.workspace_bytes <= kMaxWorkspace) out.push_back(a);
  }
  return out;
}

// Asks cuDNN for the candidates of one problem and direction (Note [Convolution algorithms]). A query cuDNN
// refuses (for some layouts and types) gives none, like an empty candidate list.
std::vector<ConvAlgo> candidates(const DeviceContext::DnnLease& lease, Stream stream, const Problem& p,
                                 const Descs& d, Dir dir, const Operands& o) {
  int count = 0;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  const bool bench = p.search;
  // The timed search gets a scratch block of its own, returned to the pool afterwards: the per-stream
  // workspace only grows to what the chosen algorithms need.
  DataPtr scratch = bench ? allocate(kMaxWorkspace, stream) : DataPtr();
  void* ws = scratch.get();
  const size_t ws_bytes = scratch.nbytes();
  if (dir == Dir::fwd) {
    cudnnConvolutionFwdAlgoPerf_t perfs[kMaxCandidates];
    if (bench)
      st = cudnnFindConvolutionForwardAlgorithmEx(lease.handle, d.x.h, o.x, d.w.h, o.w, d.conv.h, d.y.h,
                                                  o.out, kMaxCandidates, &count, perfs, ws, ws_bytes);
    else
      st = cudnnGetConvolutionForwardAlgorithm_v7(lease.handle, d.x.h, d.w.h, d.conv.h, d.y.h, kMaxCandidates,
                                                  &count, perfs);
    if (st == CUDNN_STATUS_SUCCESS) return usable(perfs, count, p, lease.handle, d, dir);
  } else if (dir == Dir::bwd_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perfs[kMaxCandidates];
    if (bench)
      st = cudnnFindConvolutionBackwardDataAlgorithmEx(lease.handle, d.w.h, o.w, d.y.h, o.y, d.conv.h, d.x.h,
                                                       o.out, kMaxCandidates, &count, perfs, ws, ws_bytes);
    else
      st = cudnnGetConvolutionBackwardDataAlgorithm_v7(lease.handle, d.w.h, d.y.h, d.conv.h, d.x.h,
                                                       kMaxCandidates, &count, perfs);
    if (st == CUDNN_STATUS_SUCCESS) return usable(perfs, count, p, lease.handle, d, dir);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perfs[kMaxCandidates];
    if (bench)
      st =
          cudnnFindConvolutionBackwardFilterAlgorithmEx(lease.handle, d.x.h, o.x, d.y.h, o.y, d.conv.h, d.w.h,
                                                        o.out, kMaxCandidates, &count, perfs, ws, ws_bytes);
    else
      st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(lease.handle, d.x.h, d.y.h, d.conv.h, d.w.h,
                                                         kMaxCandidates, &count, perfs);
    if (st == CUDNN_STATUS_SUCCESS) return usable(perfs, count, p, lease.handle, d, dir);
  }
  return {};
}

// Queues one direction with algorithm `a`: out = conv(x, w) (fwd), dx = conv^T(gy, w) (bwd_data) or
// dw = corr(x, gy) (bwd_filter), overwriting out (beta = 0). Returns cuDNN's status.
cudnnStatus_t enqueue(DeviceContext& ctx, const DeviceContext::DnnLease& lease, Stream stream,
                      const Problem& p, const Descs& d, Dir dir, const Operands& o, const ConvAlgo& a) {
  CZ_CHECK_STATUS(cudnnSetConvolutionMathType(d.conv.h, a.math));
  void* ws = ctx.cudnn_workspace(lease, stream, a.workspace_bytes);
  // Scaling factors are f64 for f64 data and f32 otherwise (cuDNN's rule).
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const void* one = p.dtype == DType::f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* zero = p.dtype == DType::f64 ? static_cast<const void*>(&zero_d) : &zero_f;
  switch (dir) {
    case Dir::fwd:
      return cudnnConvolutionForward(lease.handle, one, d.x.h, o.x, d.w.h, o.w, d.conv.h,
                                     cudnnConvolutionFwdAlgo_t(a.algo), ws, a.workspace_bytes, zero, d.y.h,
                                     o.out);
    case Dir::bwd_data:
      return cudnnConvolutionBackwardData(lease.handle, one, d.w.h, o.w, d.y.h, o.y, d.conv.h,
                                          cudnnConvolutionBwdDataAlgo_t(a.algo), ws, a.workspace_bytes, zero,
                                          d.x.h, o.out);
    case Dir::bwd_filter:
      return cudnnConvolutionBackwardFilter(lease.handle, one, d.x.h, o.x, d.y.h, o.y, d.conv.h,
                                            cudnnConvolutionBwdFilterAlgo_t(a.algo), ws, a.workspace_bytes,
                                            zero, d.w.h, o.out);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// Runs one direction with the cached algorithm, or, on the problem's first call, with the first candidate
// cuDNN accepts to run (heuristic candidates are not always runnable: a refusal queues nothing, and the next
// one is tried), which is then cached. Returns false, having queued nothing, when no candidate runs; that is
// cached too, and the caller takes its own path. Any other cuDNN error throws.
bool try_run(const Problem& problem, Dir dir, const Operands& o, Stream stream) {
  DeviceContext& ctx = context(stream.device.index);
  Problem p = problem;
  p.tf32 = ctx.allow_tf32();
  p.search = ctx.conv_benchmark() && !ctx.reproducible();  // Note [Reproducible runs]
  DeviceContext::DnnLease lease = ctx.cudnn(stream);
  Descs d(p);
  const std::string key = p.key(dir, d.math);
  auto& cache = *lease.conv_algos;
  if (auto it = cache.find(key); it != cache.end()) {
    if (!it->second.found) return false;
    const cudnnStatus_t st = enqueue(ctx, lease, stream, p, d, dir, o, it->second);
    if (st == CUDNN_STATUS_SUCCESS) return true;
    if (!refused(st)) CZ_CHECK_STATUS(st);
    // The cached algorithm refused a problem it ran before (it may depend on what the key leaves out, such
    // as pointer alignment): search again.
  }
  for (const ConvAlgo& a : candidates(lease, stream, p, d, dir, o)) {
    const cudnnStatus_t st = enqueue(ctx, lease, stream, p, d, dir, o, a);
    if (st == CUDNN_STATUS_SUCCESS) {
      cache[key] = a;
      return true;
    }
    if (!refused(st)) CZ_CHECK_STATUS(st);
  }
  cache[key] = ConvAlgo{};
  return false;
}

// y (rows, c) += bias (c).
void add_bias(const Tensor& bias, Tensor& y, int64_t c, Stream stream) {
  if (!bias.defined() || y.numel() == 0) return;
  CZ_CHECK_STATUS(launch::add_bias(detail::config_of(stream), y.dtype(), y.raw_data(), bias.raw_data(),
                                   y.numel() / c, c));
}

// db (c) = column sums of gy (rows, c): fixed partitions, no atomics.
void bias_grad(const Tensor& gy, Tensor& db, int64_t c, Stream stream) {
  if (!db.defined()) return;
  const launch::Config cfg = detail::config_of(stream);
  const int64_t rows = gy.numel() / c;
  DataPtr ws = allocate(launch::column_sums_workspace(gy.dtype(), rows, c, cfg.sm_count), stream);
  CZ_CHECK_STATUS(
      launch::column_sums(cfg, gy.dtype(), gy.raw_data(), nullptr, rows, c, db.raw_data(), ws.get()));
}

void check_nhwc(const char* op, const char* what, const Tensor& t, DType dtype, Stream stream) {
  detail::check_operand(op, what, t, dtype, stream);
  CZ_CHECK_SHAPE(t.dim() == 4, "cuda::{}: {} must be NHWC, got shape {}", op, what, shape_str(t.sizes()));
  CZ_CHECK_SHAPE(t.numel() <= 0x7fffffff, "cuda::{}: {} has {} elements, more than cuDNN indexes", op, what,
                 t.numel());
}

void check_like(const char* op, const char* what, const Tensor& t, const Shape& sizes, DType dtype,
                Stream stream) {
  if (!t.defined()) return;
  detail::check_operand(op, what, t, dtype, stream);
  CZ_CHECK_SHAPE(t.sizes() == sizes, "cuda::{}: {} has shape {}, expected {}", op, what, shape_str(t.sizes()),
                 shape_str(sizes));
}

// Depthwise: the kernels' (k, k, C) weight is not a layout cuDNN can describe (its filters are KCRS or KRSC
// packed, and with one input channel per group both mean (C, k, k)), so it is transposed on the device; the
// weights are tiny (49 C values).
Problem depthwise_problem(const Tensor& x, int64_t k) {
  const char* op = "depthwise_conv2d";
  const int c = to_int(op, x.size(3)), h = to_int(op, x.size(1)), w = to_int(op, x.size(2));
  return {op, x.dtype(), to_int(op, x.size(0)), h, w, c, c, int(k), int(k / 2), 1, c, h, w};
}

Tensor crs_from_rsc(const Tensor& wk, Stream stream) {
  const int64_t k = wk.size(0), c = wk.size(2);
  Tensor out = detail::empty_on({c, k * k}, wk.dtype(), stream);
  copy(wk.view({k * k, c}).transpose(0, 1), out, stream);
  return out;
}

// x NHWC and w (k, k, C) with k odd, on the stream's device; returns C.
int64_t check_depthwise(const char* op, const Tensor& x, const Tensor& w, Stream stream) {
  detail::check_float(op, "x", x);
  check_nhwc(op, "x", x, x.dtype(), stream);
  const int64_t c = x.size(3);
  CZ_CHECK_SHAPE(w.dim() == 3 && w.size(0) == w.size(1) && w.size(0) % 2 == 1 && w.size(2) == c,
                 "cuda::{}: w has shape {}, expected (k, k, {}) with k odd", op, shape_str(w.sizes()), c);
  detail::check_operand(op, "w", w, x.dtype(), stream);
  return c;
}

}  // namespace

// Note [Depthwise paths]: DepthwiseAlgo::tiled (the default) runs 7x7 problems on the tiled kernels, whose
// backward gives dx, dw and db from one pass over gy and x; other kernel sizes go to cuDNN. cudnn runs every
// problem on cuDNN where it has an algorithm (the bias and its gradient on our kernels), and direct every
// problem on the direct kernels. A problem cuDNN cannot run takes the tiled kernels where they apply, the
// direct ones otherwise.
namespace {

bool tiled_ok(const Tensor& x, int64_t k, Stream stream) {
  return k == 7 && launch::depthwise7_supported(x.dtype(), x.size(0), x.size(1), x.size(2), x.size(3),
                                                context(stream.device.index).sm_count());
}

}  // namespace

void depthwise_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y,
                              Stream stream) {
  constexpr const char* op = "depthwise_conv2d_forward";
  const int64_t c = check_depthwise(op, x, w, stream);
  check_like(op, "bias", bias, {c}, x.dtype(), stream);
  check_like(op, "y", y, x.sizes(), x.dtype(), stream);
  if (x.numel() == 0) return;
  DeviceGuard guard(stream.device.index);
  const DepthwiseAlgo algo = context(stream.device.index).depthwise_algo();
  const int64_t k = w.size(0);
  const bool tiled = algo != DepthwiseAlgo::direct && tiled_ok(x, k, stream);
  const launch::Config cfg = detail::config_of(stream);
  const void* b = bias.defined() ? bias.raw_data() : nullptr;
  if (tiled && algo == DepthwiseAlgo::tiled) {
    CZ_CHECK_STATUS(launch::depthwise7_forward(cfg, x.dtype(), x.raw_data(), w.raw_data(), b, y.raw_data(),
                                               x.size(0), x.size(1), x.size(2), c));
    return;
  }
  if (algo != DepthwiseAlgo::direct) {
    const Tensor wt = crs_from_rsc(w, stream);
    if (try_run(depthwise_problem(x, k), Dir::fwd, {x.raw_data(), wt.raw_data(), nullptr, y.raw_data()},
                stream)) {
      add_bias(bias, y, c, stream);
      return;
    }
  }
  if (tiled)
    CZ_CHECK_STATUS(launch::depthwise7_forward(cfg, x.dtype(), x.raw_data(), w.raw_data(), b, y.raw_data(),
                                               x.size(0), x.size(1), x.size(2), c));
  else
    CZ_CHECK_STATUS(launch::depthwise_forward(cfg, x.dtype(), x.raw_data(), w.raw_data(), b, y.raw_data(),
                                              x.size(0), x.size(1), x.size(2), c, int(k)));
}

void depthwise_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                               Tensor& dbias, Stream stream) {
  constexpr const char* op = "depthwise_conv2d_backward";
  const int64_t c = check_depthwise(op, x, w, stream);
  check_like(op, "gy", gy, x.sizes(), x.dtype(), stream);
  check_like(op, "dx", dx, x.sizes(), x.dtype(), stream);
  check_like(op, "dw", dw, w.sizes(), x.dtype(), stream);
  check_like(op, "dbias", dbias, {c}, x.dtype(), stream);
  DeviceGuard guard(stream.device.index);
  if (x.numel() == 0) {
    if (dw.defined()) fill(dw, 0.0, stream);
    if (dbias.defined()) fill(dbias, 0.0, stream);
    return;
  }
  const Problem p = depthwise_problem(x, w.size(0));
  const launch::Config cfg = detail::config_of(stream);
  const int k = int(w.size(0));
  const int64_t n = x.size(0), h = x.size(1), ww = x.size(2);
  const DepthwiseAlgo algo = context(stream.device.index).depthwise_algo();
  const bool tiled = algo != DepthwiseAlgo::direct && tiled_ok(x, k, stream);
  auto raw = [](Tensor& t) { return t.defined() ? t.raw_data() : nullptr; };
  // dx, dw, db (each when asked for) from one tiled pass.
  auto run_tiled = [&](Tensor& tdx, Tensor& tdw, Tensor& tdb) {
    DataPtr ws;
    if (tdw.defined() || tdb.defined())
      ws = allocate(launch::depthwise7_backward_workspace(x.dtype(), n, h, ww, c, cfg.sm_count), stream);
    CZ_CHECK_STATUS(launch::depthwise7_backward(cfg, x.dtype(), gy.raw_data(), x.raw_data(), w.raw_data(),
                                                raw(tdx), raw(tdw), raw(tdb), n, h, ww, c, ws.get()));
  };
  if (tiled && algo == DepthwiseAlgo::tiled) return run_tiled(dx, dw, dbias);
  Tensor none;
  if (dx.defined()) {
    bool done = false;
    if (algo != DepthwiseAlgo::direct) {
      const Tensor wt = crs_from_rsc(w, stream);
      done = try_run(p, Dir::bwd_data, {nullptr, wt.raw_data(), gy.raw_data(), dx.raw_data()}, stream);
    }
    if (!done && tiled)
      CZ_CHECK_STATUS(launch::depthwise7_backward_data(cfg, x.dtype(), gy.raw_data(), w.raw_data(),
                                                       dx.raw_data(), n, h, ww, c));
    else if (!done)
      CZ_CHECK_STATUS(launch::depthwise_backward_data(cfg, x.dtype(), gy.raw_data(), w.raw_data(),
                                                      dx.raw_data(), n, h, ww, c, k));
  }
  if (dw.defined()) {
    bool done = false;
    if (algo != DepthwiseAlgo::direct) {
      Tensor dwt = detail::empty_on({c, int64_t(k) * k}, x.dtype(), stream);
      done = try_run(p, Dir::bwd_filter, {x.raw_data(), nullptr, gy.raw_data(), dwt.raw_data()}, stream);
      if (done) {
        Tensor dst = dw.view({int64_t(k) * k, c});
        copy(dwt.transpose(0, 1), dst, stream);
      }
    }
    if (!done && tiled) {
      return run_tiled(none, dw, dbias);  // db from the same pass
    } else if (!done) {
      DataPtr ws =
          allocate(launch::depthwise_backward_filter_workspace(x.dtype(), n, h, c, k, cfg.sm_count), stream);
      CZ_CHECK_STATUS(launch::depthwise_backward_filter(cfg, x.dtype(), gy.raw_data(), x.raw_data(),
                                                        dw.raw_data(), n, h, ww, c, k, ws.get()));
    }
  }
  bias_grad(gy, dbias, c, stream);
}

namespace {

// Patchify: the kernels' (Cout, k, k, Cin) weight is cuDNN's KRSC filter as it is.
Problem patchify_problem(const Tensor& x, const Tensor& w) {
  const char* op = "patchify_conv2d";
  const int64_t k = w.size(1);
  return {op,
          x.dtype(),
          to_int(op, x.size(0)),
          to_int(op, x.size(1)),
          to_int(op, x.size(2)),
          to_int(op, x.size(3)),
          to_int(op, w.size(0)),
          int(k),
          0,
          int(k),
          1,
          to_int(op, x.size(1) / k),
          to_int(op, x.size(2) / k)};
}

void check_patchify(const char* op, const Tensor& x, const Tensor& w, Stream stream) {
  detail::check_float(op, "x", x);
  check_nhwc(op, "x", x, x.dtype(), stream);
  detail::check_operand(op, "w", w, x.dtype(), stream);
  CZ_CHECK_SHAPE(w.dim() == 4 && w.size(1) == w.size(2) && w.size(1) > 0 && w.size(3) == x.size(3) &&
                     x.size(1) >= w.size(1) && x.size(2) >= w.size(1),
                 "cuda::{}: w has shape {} for x {}; expected (Cout, k, k, {}) with k <= H, W", op,
                 shape_str(w.sizes()), shape_str(x.sizes()), x.size(3));
  // The output can hold more elements than x (the stem: 3 channels in, 96 out at 1/16 of the pixels).
  const int64_t k = w.size(1), y_numel = x.size(0) * (x.size(1) / k) * (x.size(2) / k) * w.size(0);
  CZ_CHECK_SHAPE(y_numel <= 0x7fffffff, "cuda::{}: the output has {} elements, more than cuDNN indexes", op,
                 y_numel);
}

// Note [Patchify as a GEMM] (patches.h), for shapes cuDNN has no algorithm for: the patches copied out of x
// (one strided copy), then one GEMM with the bias epilogue.
Tensor gathered_patches(const Tensor& x, int64_t k, Stream stream) {
  const int64_t ho = x.size(1) / k, wo = x.size(2) / k;
  Tensor p = empty({x.size(0) * ho * wo, k * k * x.size(3)}, x.dtype(), x.device());
  Tensor p6 = p.view({x.size(0), ho, wo, k, k, x.size(3)});
  copy(patches_view(x, k), p6, stream);
  return p;
}

void patchify_forward_gemm(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, Stream stream) {
  StreamGuard on(stream);  // temporaries belong to the stream that uses them
  const int64_t k = w.size(1), cout = w.size(0);
  const Tensor p = gathered_patches(x, k, stream);
  Tensor y2d = y.view({p.size(0), cout});
  linear_forward(p, w.view({cout, p.size(1)}), bias, y2d, stream);
}

// dx (when defined) = the patch gradients scattered back, zero where the floor dropped rows or columns.
void patchify_backward_gemm(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                            Tensor& dbias, Stream stream) {
  StreamGuard on(stream);
  const int64_t k = w.size(1), cout = w.size(0);
  const Tensor p = gathered_patches(x, k, stream);
  Tensor dp = dx.defined() ? empty(p.sizes(), p.dtype(), p.device()) : Tensor();
  Tensor dw2d = dw.defined() ? dw.view({cout, p.size(1)}) : Tensor();
  linear_backward(gy.view({p.size(0), cout}), p, w.view({cout, p.size(1)}), dp, dw2d, dbias, stream);
  if (!dx.defined()) return;
  if (x.size(1) % k != 0 || x.size(2) % k != 0) fill(dx, 0.0, stream);
  Tensor dx_patches = patches_view(dx, k);
  copy(dp.view(dx_patches.sizes()), dx_patches, stream);
}

}  // namespace

void patchify_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, Stream stream) {
  constexpr const char* op = "patchify_conv2d_forward";
  check_patchify(op, x, w, stream);
  const int64_t k = w.size(1), cout = w.size(0);
  check_like(op, "bias", bias, {cout}, x.dtype(), stream);
  check_like(op, "y", y, {x.size(0), x.size(1) / k, x.size(2) / k, cout}, x.dtype(), stream);
  if (y.numel() == 0) return;
  DeviceGuard guard(stream.device.index);
  if (context(stream.device.index).patchify_gemm() ||
      !try_run(patchify_problem(x, w), Dir::fwd, {x.raw_data(), w.raw_data(), nullptr, y.raw_data()}, stream))
    return patchify_forward_gemm(x, w, bias, y, stream);
  add_bias(bias, y, cout, stream);
}

void patchify_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                              Tensor& dbias, Stream stream) {
  constexpr const char* op = "patchify_conv2d_backward";
  check_patchify(op, x, w, stream);
  const int64_t k = w.size(1), cout = w.size(0);
  check_like(op, "gy", gy, {x.size(0), x.size(1) / k, x.size(2) / k, cout}, x.dtype(), stream);
  check_like(op, "dx", dx, x.sizes(), x.dtype(), stream);
  check_like(op, "dw", dw, w.sizes(), x.dtype(), stream);
  check_like(op, "dbias", dbias, {cout}, x.dtype(), stream);
  DeviceGuard guard(stream.device.index);
  if (gy.numel() == 0) {
    if (dx.defined()) fill(dx, 0.0, stream);
    if (dw.defined()) fill(dw, 0.0, stream);
    if (dbias.defined()) fill(dbias, 0.0, stream);
    return;
  }
  if (context(stream.device.index).patchify_gemm())
    return patchify_backward_gemm(gy, x, w, dx, dw, dbias, stream);
  const Problem p = patchify_problem(x, w);
  if (dx.defined()) {
    // Where the floor of H / k or W / k dropped rows or columns, their gradient is zero. cuDNN's beta = 0
    // contract covers every element of dx, but a backward-data kernel that walks the filter taps never
    // visits the dropped ones, so they are zeroed first rather than trusted to every algorithm. ConvNeXt's
    // shapes divide evenly and never pay for this fill.
    if (x.size(1) % k != 0 || x.size(2) % k != 0) fill(dx, 0.0, stream);
    if (!try_run(p, Dir::bwd_data, {nullptr, w.raw_data(), gy.raw_data(), dx.raw_data()}, stream))
      return patchify_backward_gemm(gy, x, w, dx, dw, dbias, stream);
  }
  if (dw.defined() &&
      !try_run(p, Dir::bwd_filter, {x.raw_data(), nullptr, gy.raw_data(), dw.raw_data()}, stream)) {
    Tensor no_dx;  // dx, if asked for, is done
    return patchify_backward_gemm(gy, x, w, no_dx, dw, dbias, stream);
  }
  bias_grad(gy, dbias, cout, stream);
}

}  // namespace cz::cuda
