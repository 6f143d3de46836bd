// CUDA kernels: the CPU kernels of cpu/kernels.h with the same arguments plus the stream they are queued on,
// and the same contracts (callers have validated shapes, dtypes and devices; tensors are contiguous unless a
// comment says otherwise). Compute dtypes are f32, f16 and bf16, with f32 accumulation for the 16-bit types,
// and f64 where noted. Everything is asynchronous on `stream`: no launcher waits on the host.
#pragma once

#include "tensor/kernel_types.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace cz::batch_input {
struct BatchView;  // tensor/cuda/model_input_element.h
}  // namespace cz::batch_input

namespace cz::cuda {

using cz::BinaryOp;

// Memory ops: any strides (at most 12 dimensions after merging adjacent ones).
void fill(Tensor& dst, double value, Stream stream);                 // any dtype
void copy(const Tensor& src, Tensor& dst, Stream stream);            // any dtype pair; same device
void axpy(const Tensor& x, double alpha, Tensor& y, Stream stream);  // y += alpha * x; f32/f64/f16/bf16
void scale(Tensor& x, double factor, Stream stream);                 // x *= factor; f32/f64/f16/bf16

// Keeps `stream` busy on the device for about `microseconds` without using memory bandwidth or SMs to speak
// of (tests and benchmarks of stream overlap and of the allocator's cross-stream rule).
void busy_wait(Stream stream, double microseconds);

// Elementwise (f32/f64/f16/bf16).
void binary(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out, Stream stream);
// out = residual + x * gamma (residual may be undefined). x: (..., C), gamma: (C).
void residual_scale_add(const Tensor& residual, const Tensor& x, const Tensor& gamma, Tensor& out,
                        Stream stream);
// dx = g * gamma, dgamma = sum over rows of g * x (deterministic). Either output may be undefined.
void channel_scale_backward(const Tensor& g, const Tensor& x, const Tensor& gamma, Tensor& dx, Tensor& dgamma,
                            Stream stream);

// GEMMs on cuBLASLt (f32 with optional TF32, Note [Backend switches]; f16/bf16 with f32 accumulation; f64).
// a: (M, K), b: (K, N), out: (M, N).
void matmul(const Tensor& a, const Tensor& b, Tensor& out, Stream stream);
// x: (M, in), w: (out, in), bias: (out) or undefined, y: (M, out). Bias through the BIAS epilogue.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, Stream stream);
// gy: (M, out). Each of dx, dw, db may be undefined; db comes from the dw GEMM's BGRADB epilogue when
// cuBLASLt offers it, else from a column reduction.
void linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db,
                     Stream stream);

// Reductions (f32/f64/f16/bf16; deterministic: no atomics).
// out (scalar) = factor * sum(x), accumulated in f32 (f64 for f64).
void sum(const Tensor& x, double factor, Tensor& out, Stream stream);
// out[i] = factor * s for every i, s the one element of `scalar` (read on the device: no host sync).
void broadcast_scalar(const Tensor& scalar, double factor, Tensor& out, Stream stream);

// ConvNeXt ops: the CPU kernels of cpu/kernels.h, with one difference: the saved statistics (LayerNorm's
// mean and rstd, cross-entropy's lse) are in the accumulation type, stat_dtype(x) (f32 for f32/f16/bf16,
// f64 for f64), so 16-bit training does not round them. Compute in f32 for 16-bit data.
inline DType stat_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// Exact (erf) GELU.
void gelu_forward(const Tensor& x, Tensor& y, Stream stream);
void gelu_backward(const Tensor& gy, const Tensor& x, Tensor& dx, Stream stream);

// LayerNorm over the last dimension, one warp per row. x, y: (rows, C); weight, bias: (C) or undefined; mean,
// rstd: (rows) stat_dtype. Backward: each of dx, dweight, dbias may be undefined; dweight and dbias are
// per-chunk partial sums reduced in a fixed order (deterministic, no atomics).
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                        Tensor& mean, Tensor& rstd, Stream stream);
void layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias, Stream stream);

// Global Response Normalization (Note [GRN kernels] in grn_threads.h). x, y: (N, H, W, C); gamma, beta: (C);
// gx: (N, C) and d: (N) stat_dtype, written for backward. Backward: each of dx, dgamma, dbeta may be
// undefined; every sum is in a fixed order (deterministic, no atomics).
void grn_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& gx,
                 Tensor& d, Stream stream);
void grn_backward(const Tensor& gy, const Tensor& x, const Tensor& gamma, const Tensor& gx, const Tensor& d,
                  Tensor& dx, Tensor& dgamma, Tensor& dbeta, Stream stream);

// Convolutions on cuDNN (conv.cpp), NHWC, with the CPU kernels' channels-last weights: depthwise w (k, k, C)
// (transposed to cuDNN's (C, k, k) on the device), patchify w (Cout, k, k, Cin) (cuDNN's KRSC as is). Bias
// and bias gradients through our own kernels (deterministic); each backward output may be undefined.
// Algorithms: Note [Convolution algorithms] in conv.cpp.
void depthwise_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, Stream stream);
void depthwise_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                               Tensor& dbias, Stream stream);
void patchify_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, Stream stream);
void patchify_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                              Tensor& dbias, Stream stream);

// Mean over H and W. x: (N, H, W, C), y: (N, C).
void global_avg_pool_forward(const Tensor& x, Tensor& y, Stream stream);
void global_avg_pool_backward(const Tensor& gy, Tensor& dx, Stream stream);

// Softmax cross-entropy with label smoothing, mean over rows (deterministic). logits: (N, K); labels: (N) i32
// or i64; loss: () like logits; lse: (N) stat_dtype. The labels live on the device and are not checked by
// the host: a label outside [0, K) makes the loss NaN (and its row of dlogits NaN).
void cross_entropy_forward(const Tensor& logits, const Tensor& labels, double smoothing, Tensor& loss,
                           Tensor& lse, Stream stream);
// gloss: () read on the device.
void cross_entropy_backward(const Tensor& gloss, const Tensor& logits, const Tensor& labels,
                            const Tensor& lse, double smoothing, Tensor& dlogits, Stream stream);
// Softmax cross-entropy against soft targets, mean over rows (deterministic). logits, targets: (N, K) of one
// dtype; loss: () like logits; lse, tsum: (N) stat_dtype. Backward: dlogits, dtargets (N, K), either
// undefined.
void soft_target_cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                                       Tensor& tsum, Stream stream);
void soft_target_cross_entropy_backward(const Tensor& gloss, const Tensor& logits, const Tensor& targets,
                                        const Tensor& lse, const Tensor& tsum, Tensor& dlogits,
                                        Tensor& dtargets, Stream stream);
// x: (rows, K) -> out: (rows) i64, the first index of the largest value (NaN counts as largest).
void argmax(const Tensor& x, Tensor& out, Stream stream);

// y[n, ...] = x[n, ...] * scale[n] (drop path). scale: (N) like x.
void sample_scale(const Tensor& x, const Tensor& scale, Tensor& y, Stream stream);
// out (n, H, W, 3) f32, contiguous, on the stream's device: every element of the batch `b` describes
// (src/io/data/model_input.h); b's arrays stay alive until the stream has run it.
void model_input(const batch_input::BatchView& b, Tensor& out, Stream stream);

}  // namespace cz::cuda
