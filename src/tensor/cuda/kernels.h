// CUDA kernels: the CPU kernels of cpu/kernels.h with the same arguments plus the stream they are queued on,
// and the same contracts (callers have validated shapes, dtypes and devices; tensors are contiguous unless a
// comment says otherwise). Compute dtypes are f32, f16 and bf16, with f32 accumulation for the 16-bit types,
// and f64 where noted. Everything is asynchronous on `stream`: no launcher waits on the host.
#pragma once

#include "tensor/kernel_types.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

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

// GEMMs on cuBLASLt (f32 with optional TF32, see set_allow_tf32; f16/bf16 with f32 accumulation; f64).
// a: (M, K), b: (K, N), out: (M, N).
void matmul(const Tensor& a, const Tensor& b, Tensor& out, Stream stream);
// x: (M, in), w: (out, in), bias: (out) or undefined, y: (M, out). Bias through the BIAS epilogue.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, Stream stream);
// gy: (M, out). Each of dx, dw, db may be undefined; db comes from the dw GEMM's BGRADB epilogue when
// cuBLASLt offers it, else from a column reduction.
void linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db,
                     Stream stream);

// Fused linear + GELU for the ops layer. NOTE: cuBLASLt's GELU epilogue is the tanh approximation
// 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))), not the exact erf GELU of ops/activation.h, and so are
// these kernels (their unfused fallback included); use them only where the tanh form is wanted. y =
// gelu_tanh(x w^T + bias), pre = x w^T + bias (saved for backward). pre, y: (M, out).
void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, Tensor& pre,
                         Stream stream);
// Backward of linear_gelu_forward: with dpre = gy * gelu_tanh'(pre), the gradients of linear_backward(dpre).
void linear_gelu_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& pre, Tensor& dx,
                          Tensor& dw, Tensor& db, Stream stream);
// The input gradient of a linear layer (gy: (M, out), w: (out, in)) taken on through the GELU that produced
// its input: dpre = (gy w) * gelu_tanh'(pre), pre: (M, in), in one GEMM with the DGELU epilogue; dbias_pre
// (in), if defined, gets the column sums of dpre (the gradient of the bias before that GELU; DGELU_BGRAD).
void linear_backward_dgelu(const Tensor& gy, const Tensor& w, const Tensor& pre, Tensor& dpre,
                           Tensor& dbias_pre, Stream stream);

// Reductions (f32/f64/f16/bf16; deterministic: no atomics).
// out (scalar) = factor * sum(x), accumulated in f32 (f64 for f64).
void sum(const Tensor& x, double factor, Tensor& out, Stream stream);
// out[i] = factor * s for every i, s the one element of `scalar` (read on the device: no host sync).
void broadcast_scalar(const Tensor& scalar, double factor, Tensor& out, Stream stream);

}  // namespace cz::cuda
