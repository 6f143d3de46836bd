// Raw kernel launchers behind cuda/kernels.h. They take device pointers, sizes and dtypes rather than
// Tensors: the .cu files are compiled without fmt (nvcc cannot parse fmt 9's consteval format strings in
// C++20 mode), so validation, dtype checks and error reporting stay in the host wrappers, which check the
// returned cudaError_t with CZ_CHECK_STATUS. Every launcher queues its work on cfg.stream and returns at
// once; sizes of zero launch nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/kernel_types.h"

namespace cz::batch_input {
struct BatchView;  // tensor/cuda/model_input_element.h
}  // namespace cz::batch_input

namespace cz::cuda::launch {

struct Config {
  cudaStream_t stream;
  int sm_count;  // sizes grid-stride grids
};

// Strided geometry of up to kMaxDims dimensions for kOps operands (element strides), with adjacent dimensions
// merged wherever every operand allows it, so a contiguous tensor is one dimension of stride 1. Passed to
// kernels by value.
inline constexpr int kMaxDims = 12;

template <int kOps>
struct Geometry {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kOps][kMaxDims] = {};

  bool flat() const {
    if (ndim != 1) return false;
    for (int k = 0; k < kOps; ++k)
      if (strides[k][0] != 1) return false;
    return true;
  }
};

// Memory ops (memory_kernels.cu). `value_bits`: the destination dtype's bit pattern in the low bytes.
cudaError_t fill(const Config& cfg, DType t, void* dst, uint64_t value_bits, const Geometry<1>& g, int64_t n);
// Operand 0 of `g` is dst, operand 1 src. Any dtype pair.
cudaError_t copy(const Config& cfg, DType src_t, const void* src, DType dst_t, void* dst,
                 const Geometry<2>& g, int64_t n);
// y += alpha * x; operand 0 is y, 1 is x. Floating dtypes.
cudaError_t axpy(const Config& cfg, DType t, const void* x, double alpha, void* y, const Geometry<2>& g,
                 int64_t n);
cudaError_t scale(const Config& cfg, DType t, void* x, double factor, const Geometry<1>& g, int64_t n);

// Keeps the stream's device busy for about `nanoseconds` (one thread sleeping in a loop): for tests and
// benchmarks that need work still pending on a stream.
cudaError_t busy_wait(const Config& cfg, int64_t nanoseconds);

// Elementwise on contiguous buffers (elementwise_kernels.cu). Floating dtypes.
cudaError_t binary(const Config& cfg, DType t, BinaryOp op, const void* a, const void* b, double alpha,
                   void* out, int64_t n);
// out[i] = residual[i] + x[i] * gamma[i % c]; residual may be null.
cudaError_t residual_scale_add(const Config& cfg, DType t, const void* residual, const void* x,
                               const void* gamma, void* out, int64_t n, int64_t c);
// y (rows x cols) += bias (per column).
cudaError_t add_bias(const Config& cfg, DType t, void* y, const void* bias, int64_t rows, int64_t cols);

// Reductions (reduce_kernels.cu), deterministic: fixed partitions, partials in `workspace`, no atomics.
// out[c] = sum over r of a[r, c] * (b ? b[r, c] : 1); a, b: rows x cols row-major; out: cols.
size_t column_sums_workspace(DType t, int64_t rows, int64_t cols, int sm_count);
cudaError_t column_sums(const Config& cfg, DType t, const void* a, const void* b, int64_t rows, int64_t cols,
                        void* out, void* workspace);
// out[0] = factor * sum(x[0..n)).
size_t sum_workspace(DType t, int64_t n, int sm_count);
cudaError_t sum(const Config& cfg, DType t, const void* x, int64_t n, double factor, void* out,
                void* workspace);
// out[i] = factor * scalar[0].
cudaError_t broadcast_scalar(const Config& cfg, DType t, const void* scalar, double factor, void* out,
                             int64_t n);

// ConvNeXt ops. Floating dtypes; "acc" is the accumulation type, f32 (f64 for f64 data).
// Exact (erf) GELU (gelu.cu).
cudaError_t gelu_erf_forward(const Config& cfg, DType t, const void* x, void* y, int64_t n);
cudaError_t gelu_erf_backward(const Config& cfg, DType t, const void* gy, const void* x, void* dx, int64_t n);

// LayerNorm over rows of c values (layer_norm.cu). weight, bias may be null; mean, rstd: (rows) in acc.
cudaError_t layer_norm_forward(const Config& cfg, DType t, const void* x, const void* weight,
                               const void* bias, double eps, void* y, void* mean, void* rstd, int64_t rows,
                               int64_t c);
// dx, dweight, dbias may each be null; `workspace` (layer_norm_backward_workspace bytes) holds the per-chunk
// partial sums of dweight and dbias.
size_t layer_norm_backward_workspace(DType t, int64_t rows, int64_t c, int sm_count);
cudaError_t layer_norm_backward(const Config& cfg, DType t, const void* gy, const void* x, const void* weight,
                                const void* mean, const void* rstd, void* dx, void* dweight, void* dbias,
                                int64_t rows, int64_t c, void* workspace);

// GRN of NHWC data as (n, hw, c) (grn.cu): gx (n, c) and d (n) in acc. Backward: dx, dgamma, dbeta may each
// be null; `workspace` (grn_backward_workspace bytes) holds the per-image sums.
cudaError_t grn_forward(const Config& cfg, DType t, const void* x, const void* gamma, const void* beta,
                        double eps, void* y, void* gx, void* d, int64_t n, int64_t hw, int64_t c);
size_t grn_backward_workspace(DType t, int64_t n, int64_t c);
cudaError_t grn_backward(const Config& cfg, DType t, const void* gy, const void* x, const void* gamma,
                         const void* gx, const void* d, void* dx, void* dgamma, void* dbeta, int64_t n,
                         int64_t hw, int64_t c, void* workspace);

// Global average pool of NHWC data as (n, hw, c) (pool.cu).
cudaError_t global_avg_pool_forward(const Config& cfg, DType t, const void* x, void* y, int64_t n, int64_t hw,
                                    int64_t c);
cudaError_t global_avg_pool_backward(const Config& cfg, DType t, const void* gy, void* dx, int64_t n,
                                     int64_t hw, int64_t c);

// Cross-entropy with label smoothing over logits (n, k), labels (n) of dtype label_t (i32/i64) (loss.cu).
// A label outside [0, k) makes its row's lse and the loss NaN (and its gradient row NaN): the device cannot
// throw, and a NaN loss is what the training loop already watches for.
size_t cross_entropy_workspace(DType t, int64_t n);
cudaError_t cross_entropy_forward(const Config& cfg, DType t, DType label_t, const void* logits,
                                  const void* labels, double smoothing, void* loss, void* lse, int64_t n,
                                  int64_t k, void* workspace);
// gloss: the scalar loss gradient, read on the device.
cudaError_t cross_entropy_backward(const Config& cfg, DType t, DType label_t, const void* gloss,
                                   const void* logits, const void* labels, const void* lse, double smoothing,
                                   void* dlogits, int64_t n, int64_t k);
// Soft targets (Note [Soft-target cross-entropy kernels]): targets like logits; lse and tsum (n) in the
// accumulation type; workspace: cross_entropy_workspace(t, n) bytes. Backward: dlogits, dtargets may be null.
cudaError_t soft_target_cross_entropy_forward(const Config& cfg, DType t, const void* logits,
                                              const void* targets, void* loss, void* lse, void* tsum,
                                              int64_t n, int64_t k, void* workspace);
cudaError_t soft_target_cross_entropy_backward(const Config& cfg, DType t, const void* gloss,
                                               const void* logits, const void* targets, const void* lse,
                                               const void* tsum, void* dlogits, void* dtargets, int64_t n,
                                               int64_t k);
// out (rows) i64: first index of the largest value of each row of k, NaN counting as largest.
cudaError_t argmax(const Config& cfg, DType t, const void* x, int64_t* out, int64_t rows, int64_t k);

// Depthwise k x k convolution, stride 1, padding k/2, NHWC x (n, h, w, c) and weight (k, k, c)
// (depthwise.cu); bias may be null.
// The tiled 7x7 kernels (Note [Tiled depthwise kernels] in depthwise_tiles.h): f32, f16, bf16 with f32
// accumulation, for every size depthwise7_supported accepts (all but grids past CUDA's limits).
// depthwise7_backward computes any of dx, dw and db (each may be null) from one pass over gy and x, then adds
// the per-tile partials of dw and db in a fixed order; it needs depthwise7_backward_workspace bytes when dw
// or db is asked for.
bool depthwise7_supported(DType t, int64_t n, int64_t h, int64_t w, int64_t c, int sm_count);
cudaError_t depthwise7_forward(const Config& cfg, DType t, const void* x, const void* w, const void* bias,
                               void* y, int64_t n, int64_t h, int64_t ww, int64_t c);
cudaError_t depthwise7_backward_data(const Config& cfg, DType t, const void* gy, const void* w, void* dx,
                                     int64_t n, int64_t h, int64_t ww, int64_t c);
size_t depthwise7_backward_workspace(DType t, int64_t n, int64_t h, int64_t ww, int64_t c, int sm_count);
cudaError_t depthwise7_backward(const Config& cfg, DType t, const void* gy, const void* x, const void* w,
                                void* dx, void* dw, void* db, int64_t n, int64_t h, int64_t ww, int64_t c,
                                void* workspace);
// The direct kernels, any odd k, f32/f64/f16/bf16: the path for other kernel sizes where cuDNN has no
// algorithm, and the reference path (DepthwiseAlgo::direct). The filter gradient supports k = 3, 5, 7, 9
// (cudaErrorNotSupported otherwise) and needs depthwise_backward_filter_workspace bytes.
cudaError_t depthwise_forward(const Config& cfg, DType t, const void* x, const void* w, const void* bias,
                              void* y, int64_t n, int64_t h, int64_t ww, int64_t c, int k);
cudaError_t depthwise_backward_data(const Config& cfg, DType t, const void* gy, const void* w, void* dx,
                                    int64_t n, int64_t h, int64_t ww, int64_t c, int k);
size_t depthwise_backward_filter_workspace(DType t, int64_t n, int64_t h, int64_t c, int k, int sm_count);
cudaError_t depthwise_backward_filter(const Config& cfg, DType t, const void* gy, const void* x, void* dw,
                                      int64_t n, int64_t h, int64_t ww, int64_t c, int k, void* workspace);

// y[i] = x[i] * scale[i / inner] (drop_path.cu).
cudaError_t sample_scale(const Config& cfg, DType t, const void* x, const void* scale, void* y, int64_t n,
                         int64_t inner);

// out (n, b.height, b.width, 3) f32 = batch_input::element of every element (model_input.cu); b's pointers
// are host memory the device addresses (pinned) or device memory.
cudaError_t model_input(const Config& cfg, const batch_input::BatchView& b, int64_t n, float* out);

}  // namespace cz::cuda::launch
