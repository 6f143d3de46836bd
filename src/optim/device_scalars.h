// The optimizer step's per-step scalars in device memory (Note [The optimizer's device scalars]): the slots
// of the buffer and the per-thread arithmetic of the kernels that read them, as host/device functions. The
// CUDA kernels (cuda_optim_kernels.cu) call them; tests/optim/test_device_scalars.cpp runs the same functions
// on the CPU against the host's eager computation. Plain C++ apart from CZ_HD: no CUDA header is needed to
// include it. Compile users with -ffp-contract=off on the host (the device functions use round-to-nearest
// intrinsics), so that no multiply-add is fused on either side.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/cuda/host_device.h"

namespace cz::optim_scalars {

// Note [The optimizer's device scalars]
// The eager CUDA update takes lr, the bias corrections and the clip coefficient as kernel arguments the host
// computes each step, and the host reads the gradient norm and the fp16 overflow flag before deciding to clip
// or skip. A CUDA graph replays kernel arguments as captured, so the update a graph replays reads them from
// one small f64 buffer instead, and decides on the device:
//  * the host writes lr, the step's bias corrections (for the step count it knows: 1 - beta^t with the host's
//    std::pow, the same function the eager path calls, so both paths use the same bits; CUDA's pow is not
//    correctly rounded), SGD's first-step flag and fp16's 1 / scale into slots kLr..kInvScale with one
//    host-to-device copy (Tensor::copy_ from a CPU tensor: cudaMemcpyAsync from pinned staging memory that
//    the pinned allocator keeps until the copy has read it) queued before the replay, outside the graph: the
//    value is fixed when the copy is queued, so the host may write the next step's at any time, and the eager
//    path can run the same kernels the same way;
//  * the unscale kernel reads 1 / scale from kInvScale and sets the overflow flag (an f32 0-d tensor, zeroed
//    in the graph);
//  * one single-thread kernel turns the summed squared norm and the flag into kNorm, kClipCoef (1 on
//    overflow or without clipping) and kFound (the flag as f64, so one read gets the norm and the flag);
//  * the clip's scaling, the update and the EMA read the flag and do nothing on overflow (as torch's fused
//    AdamW does with found_inf); each block of the update first makes the per-piece constants from kLr (and
//    kBc1) in shared memory, with the host's operations in the host's order.
// After the step's closing synchronize the host reads kNorm and kFound (one 16-byte copy): the LossScaler's
// state machine and the optimizer's step count advance on the host from the flag, and the log takes the norm.
enum Slot : int {
  kLr = 0,
  kBc1,         // AdamW: 1 - beta1^t
  kInvSqrtBc2,  // AdamW: 1 / sqrt(1 - beta2^t)
  kFirstStep,   // SGD: 1 on the first step (the buffer starts as the gradient), else 0
  kInvScale,    // fp16: 1 / loss scale; 1 without loss scaling
  kNorm,        // written on the device: the global gradient norm, before clipping
  kFound,       // written on the device: 1 when the gradients overflowed (the step is skipped), else 0
  kClipCoef,    // written on the device: what the gradients are multiplied by (1: not clipped)
  kSlots
};

// IEEE double operations, never fused: intrinsics on the device, plain operators on the host.
CZ_HD double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
CZ_HD double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
CZ_HD double div_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
CZ_HD double sqrt_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

template <class T>
CZ_HD T fma_of(T a, T b, T c) {
#if defined(__CUDA_ARCH__)
  return fma(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
template <class T>
CZ_HD T sqrt_of(T a) {
#if defined(__CUDA_ARCH__)
  return sqrt(a);
#else
  return std::sqrt(a);
#endif
}

// One element of the CUDA updates (both the kernel-argument and the device-scalar kernels), in T (f32/f64),
// with the CPU kernels' fma placement (cpu_adamw.cpp): a, b are the piece's constants rounded to T.
template <class T>
struct AdamWElementConstants {
  T one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2, eps;
};
template <class T>
CZ_HD void adamw_element(T& p, T g, T& m, T& v, T a, T b, const AdamWElementConstants<T>& c) {
  const T mi = fma_of(g - m, c.one_minus_beta1, m);
  const T vi = fma_of(g * g, c.one_minus_beta2, v * c.beta2);
  const T denom = fma_of(sqrt_of(vi), c.inv_sqrt_bc2, c.eps);
  p = fma_of(b, mi / denom, p * a);
  m = mi;
  v = vi;
}
// SGD: buf is the element's momentum buffer (unused without momentum).
template <class T>
CZ_HD void sgd_element(T& p, T g, T& buf, T a, T b, T momentum, T one_minus_dampening, bool use_momentum,
                       bool nesterov, bool first_step) {
  T d = fma_of(a, p, g);
  if (use_momentum) {
    const T bi = first_step ? d : fma_of(d, one_minus_dampening, buf * momentum);
    buf = bi;
    d = nesterov ? fma_of(momentum, bi, d) : bi;
  }
  p = fma_of(b, d, p);
}

// AdamW's per-piece constants (kernel_args.h): p = p a + b m / denom, with lr_p = lr lr_scale,
// a = 1 - lr_p wd, b = -(lr_p / bc1): cuda::adamw_step's host arithmetic, operation for operation.
struct PieceConstants {
  double a, b;
};
CZ_HD PieceConstants adamw_piece(double lr, double lr_scale, double weight_decay, double bc1) {
  const double lr_p = mul_rn(lr, lr_scale);
  return {add_rn(1.0, -mul_rn(lr_p, weight_decay)), -div_rn(lr_p, bc1)};
}
// SGD's: g' = g + a p, p += b g', with a = wd, b = -(lr lr_scale).
CZ_HD PieceConstants sgd_piece(double lr, double lr_scale, double weight_decay) {
  return {weight_decay, -mul_rn(lr, lr_scale)};
}

// The global norm and the clipping coefficient from the summed squares, as clip_coefficient (clip.h) and
// ShardedState compute them on the host: norm = sqrt(sq), coef = min(1, max_norm / (norm + 1e-6)) with NaN
// kept; max_norm <= 0: no clipping (coef 1). On overflow (found) the step is skipped and coef is 1.
struct ClipResult {
  double norm, coef;
};
CZ_HD ClipResult clip_of(double sq, bool found, double max_norm) {
  const double norm = sqrt_rn(sq);
  if (found || !(max_norm > 0)) return {norm, 1.0};
  const double coef = div_rn(max_norm, add_rn(norm, 1e-6));
  return {norm, coef != coef || coef < 1.0 ? coef : 1.0};
}

// Whether the update (and the clip's scaling, and the EMA) runs: the overflow flag is 0.
CZ_HD bool take_step(float found) {
  return found == 0.0f;
}

// The host's part: the bias corrections of AdamW's step `step` (1-based), as the eager CUDA path passes them.
struct BiasCorrections {
  double bc1, inv_sqrt_bc2;
};
inline BiasCorrections adamw_bias_corrections(double beta1, double beta2, int64_t step) {
  const double bc2 = 1.0 - std::pow(beta2, double(step));
  return {1.0 - std::pow(beta1, double(step)), 1.0 / std::sqrt(bc2)};
}

}  // namespace cz::optim_scalars
