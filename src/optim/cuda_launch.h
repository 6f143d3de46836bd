// Raw launchers of the optimizer's CUDA kernels (cuda_optim_kernels.cu): device pointers and plain numbers
// only, so nvcc never sees fmt (see docs/cuda.md). The Tensor-level entry points are in cuda_optim.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tensor/cuda/launch.h"
#include "tensor/dtype.h"

namespace cz::cuda::launch {

// Pieces per launch, passed by value as kernel arguments (no host-to-device copy to order).
inline constexpr int kMaxOptimPieces = 48;

// Per-piece constants, rounded from f64 by the host exactly as the CPU kernels round them.
struct OptimPieces {
  int count = 0;
  int64_t begin[kMaxOptimPieces];
  int64_t end[kMaxOptimPieces];
  double a[kMaxOptimPieces];  // AdamW: 1 - lr wd; SGD: wd; the *_dev kernels: lr_scale
  double b[kMaxOptimPieces];  // AdamW: -lr / bc1; SGD: -lr; the *_dev kernels: weight_decay
};

struct AdamWConstants {
  double one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2, eps;
};
struct SgdConstants {
  double momentum, one_minus_dampening;
  bool use_momentum, nesterov, first_step;
};

// f32 or f64 (t); the pieces lie inside [0, n) of the buffers.
cudaError_t adamw_step(const Config& cfg, DType t, void* p, const void* g, void* m, void* v,
                       const OptimPieces& pieces, const AdamWConstants& c);
cudaError_t sgd_step(const Config& cfg, DType t, void* p, const void* g, void* buf, const OptimPieces& pieces,
                     const SgdConstants& c);
// The same updates reading lr, the bias corrections (AdamW) and the first-step flag (SGD) from `scalars` and
// doing nothing where found[0] != 0 (Note [The optimizer's device scalars] in device_scalars.h); pieces.a/b
// hold each piece's lr_scale and weight_decay. AdamWConstants' inv_sqrt_bc2 and SgdConstants' first_step are
// not read.
cudaError_t adamw_step_dev(const Config& cfg, DType t, void* p, const void* g, void* m, void* v,
                           const OptimPieces& pieces, const AdamWConstants& c, const double* scalars,
                           const float* found);
cudaError_t sgd_step_dev(const Config& cfg, DType t, void* p, const void* g, void* buf,
                         const OptimPieces& pieces, const SgdConstants& c, const double* scalars,
                         const float* found);
// scalars[kNorm], [kFound], [kClipCoef] from sq[0] and found[0] (one thread; max_norm <= 0: no clipping).
cudaError_t clip_scalars(const Config& cfg, const double* sq, const float* found, double max_norm,
                         double* scalars);
// x *= scalars[kClipCoef] unless found[0] != 0 or the coefficient is 1.
cudaError_t scale_dev(const Config& cfg, DType t, void* x, int64_t n, const double* scalars,
                      const float* found);
// out[0] (f64) = sum x^2, deterministic (a fixed number of blocks for a given n, on any GPU).
size_t sq_norm_workspace(int64_t n);
cudaError_t sq_norm(const Config& cfg, DType t, const void* x, int64_t n, double* out, void* workspace);
// x *= factor (unless factor == 1); found[0] = 1 if any element is non-finite afterwards. With
// device_factor, factor is read from device_factor[0] (f64) instead.
cudaError_t unscale_and_check(const Config& cfg, DType t, void* x, int64_t n, double factor, float* found,
                              const double* device_factor = nullptr);
// ema = decay ema + (1 - decay) p; nothing where skip && skip[0] != 0.
cudaError_t ema_update(const Config& cfg, DType t, void* ema, const void* p, int64_t n, double decay,
                       const float* skip = nullptr);

}  // namespace cz::cuda::launch
