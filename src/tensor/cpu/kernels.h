// CPU kernels. Callers (ops) have validated shapes, dtypes and devices; kernels take contiguous tensors
// unless a comment says otherwise, and compute in f32 or f64 (f64 exists for gradient checks). Threads: see
// parallel.h.
#pragma once

#include <type_traits>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

namespace cz::cpu {

using cz::BinaryOp;

// Calls f(float{}) or f(double{}) for the kernel's compute type.
template <class F>
decltype(auto) visit_float(DType t, F&& f) {
  if (t == DType::f64) return f(double{});
  CZ_CHECK_DTYPE(t == DType::f32, "CPU kernels compute in f32 or f64, got {}", dtype_name(t));
  return f(float{});
}

// Memory ops (any strides, any dtype).
void fill(Tensor& dst, double value);
void copy(const Tensor& src, Tensor& dst);  // converts dtype
inline constexpr int64_t kStreamingCopyBytes = int64_t(64) << 10;
// dst = src where the destination is not read again soon (Tensor::copy_streaming_): one dtype, both
// contiguous; from kStreamingCopyBytes on, stores that bypass the cache, else copy().
void copy_streaming(const Tensor& src, Tensor& dst);
void axpy(const Tensor& x, double alpha, Tensor& y);  // y += alpha * x
void scale(Tensor& x, double factor);                 // x *= factor

// Elementwise.
void binary(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out);
// out = residual + x * gamma (residual may be undefined: out = x * gamma). x: (..., C), gamma: (C).
void residual_scale_add(const Tensor& residual, const Tensor& x, const Tensor& gamma, Tensor& out);
// dx = g * gamma, dgamma = sum over rows of g * x. Either output may be undefined (not needed).
void channel_scale_backward(const Tensor& g, const Tensor& x, const Tensor& gamma, Tensor& dx,
                            Tensor& dgamma);

}  // namespace cz::cpu

namespace cz::cpu {

// GEMM (OpenBLAS). a: (M, K), b: (K, N), out: (M, N).
void matmul(const Tensor& a, const Tensor& b, Tensor& out);
// x: (M, in), w: (out, in), bias: (out) or undefined, y: (M, out).
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);
// gy: (M, out). Each of dx, dw, db may be undefined (not needed).
void linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db);

// The MLP's fused epilogues (Note [Fused epilogues on the CPU], linear_fused.cpp). Rows go in tiles of
// `tile` rows (0: the process's cut's choice, fused_cut in row_tiles.h); bias may be undefined (zero); any
// gradient may be undefined.
// x: (M, in), w: (out, in), bias: (out) -> h = x w^T + bias (kept for backward), y = gelu(h): (M, out).
void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& h, Tensor& y,
                         int64_t tile = 0);
// gy: (M, out). gh: (M, out) written with gy * gelu'(h), the GEMMs' operand; db = column sums of gh.
void linear_gelu_backward(const Tensor& gy, const Tensor& x, const Tensor& h, const Tensor& w, Tensor& gh,
                          Tensor& dx, Tensor& dw, Tensor& db, int64_t tile = 0);
// y = x w^T + bias (kept for backward), out = residual + gamma * y. gamma: (out), residual: (M, out).
void linear_scale_residual_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& gamma,
                                   const Tensor& residual, Tensor& y, Tensor& out, int64_t tile = 0);
// g: (M, out), the gradient of out. gb: (M, out) written with g * gamma; db = column sums of gb, dgamma =
// column sums of g * y.
void linear_scale_residual_backward(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& w,
                                    const Tensor& gamma, Tensor& gb, Tensor& dx, Tensor& dw, Tensor& db,
                                    Tensor& dgamma, int64_t tile = 0);
// ConvNeXt's whole MLP branch and residual on row tiles (Note [The MLP on one tile]): out = residual + gamma
// * (gelu(x w1^T + b1) w2^T + b2). x, residual, out: (M, C); w1: (H, C); w2: (C, H); b1, b2 may be undefined.
// h (M, H) and y2 (M, C), when defined, receive fc1's pre-activation and fc2's output before gamma, which is
// all backward needs; the GELU output lives only in a tile.
void mlp_scale_residual_forward(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                                const Tensor& b2, const Tensor& gamma, const Tensor& residual, Tensor& h,
                                Tensor& y2, Tensor& out, int64_t tile = 0);
// g: (M, C), the gradient of out. Writes those of dx, dw1, db1, dw2, db2, dgamma that are defined; the GELU
// output and its derivative are recomputed from h on each tile.
void mlp_scale_residual_backward(const Tensor& g, const Tensor& x, const Tensor& h, const Tensor& y2,
                                 const Tensor& w1, const Tensor& w2, const Tensor& gamma, Tensor& dx,
                                 Tensor& dw1, Tensor& db1, Tensor& dw2, Tensor& db2, Tensor& dgamma,
                                 int64_t tile = 0);

}  // namespace cz::cpu

namespace cz::cpu {

// out (scalar) = factor * sum(x), accumulated in f64.
void sum(const Tensor& x, double factor, Tensor& out);
// out[i] = factor * s for every i, where s is the one element of `scalar`.
void broadcast_scalar(const Tensor& scalar, double factor, Tensor& out);

}  // namespace cz::cpu

namespace cz::cpu {

// Exact GELU. x, y, gy, dx: same shape.
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& gy, const Tensor& x, Tensor& dx);

// LayerNorm over the last dimension. x, y: (rows, C); weight, bias: (C) or undefined (no affine transform);
// mean, rstd: (rows), written for backward.
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                        Tensor& mean, Tensor& rstd);
// Each of dx, dweight, dbias may be undefined (not needed); dweight/dbias need a defined weight.
void layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias);

// Global Response Normalization (ConvNeXt V2). x, y: (N, H, W, C); gamma, beta: (C); gx: (N, C) the L2 norms
// over H and W and d: (N) mean_c(gx) + eps, written for backward. y = x + (beta + gamma * (x * gx / d)).
void grn_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& gx,
                 Tensor& d);
// gy: like x. Each of dx, dgamma, dbeta may be undefined (not needed).
void grn_backward(const Tensor& gy, const Tensor& x, const Tensor& gamma, const Tensor& gx, const Tensor& d,
                  Tensor& dx, Tensor& dgamma, Tensor& dbeta);

// Depthwise k x k convolution, stride 1, zero padding k/2. x, y: (N, H, W, C); w: (k, k, C) (channels last,
// not PyTorch's layout); bias: (C) or undefined.
void depthwise_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);
// gy: (N, H, W, C). dx: like x, dw: (k, k, C), dbias: (C); each may be undefined.
void depthwise_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                               Tensor& dbias);

// Patchify convolution, kernel = stride = k, no padding. x: (N, H, W, Cin); w: (Cout, k, k, Cin) (channels
// last, not PyTorch's layout); bias: (Cout) or undefined; y: (N, H / k, W / k, Cout).
void patchify_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);
// gy: like y. dx: like x (zero where the floor dropped rows/columns), dw: like w, dbias: (Cout); each may be
// undefined.
void patchify_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                              Tensor& dbias);

// Mean over H and W. x: (N, H, W, C), y: (N, C); gy: (N, C), dx: (N, H, W, C).
void global_avg_pool_forward(const Tensor& x, Tensor& y);
void global_avg_pool_backward(const Tensor& gy, Tensor& dx);

// Softmax cross-entropy with label smoothing, mean over rows. logits: (N, K); labels: (N) i32 or i64, already
// checked to lie in [0, K); loss: () like logits; lse: (N) log-sum-exp per row, for backward.
void cross_entropy_forward(const Tensor& logits, const Tensor& labels, double smoothing, Tensor& loss,
                           Tensor& lse);
// gloss: () the loss gradient; dlogits: (N, K).
void cross_entropy_backward(const Tensor& gloss, const Tensor& logits, const Tensor& labels,
                            const Tensor& lse, double smoothing, Tensor& dlogits);
// Softmax cross-entropy against soft targets, mean over rows. logits, targets: (N, K); loss: () like logits;
// lse: (N) log-sum-exp per row and tsum: (N) the targets' row sums, for backward.
void soft_target_cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                                       Tensor& tsum);
// dlogits, dtargets: (N, K), either may be undefined.
void soft_target_cross_entropy_backward(const Tensor& gloss, const Tensor& logits, const Tensor& targets,
                                        const Tensor& lse, const Tensor& tsum, Tensor& dlogits,
                                        Tensor& dtargets);
// x: (rows, K) -> out: (rows) i64, the first index of the largest value (NaN counts as largest).
void argmax(const Tensor& x, Tensor& out);

// y[n, ...] = x[n, ...] * scale[n] (drop path). x, y: (N, ...); scale: (N) like x.
void sample_scale(const Tensor& x, const Tensor& scale, Tensor& y);

}  // namespace cz::cpu
