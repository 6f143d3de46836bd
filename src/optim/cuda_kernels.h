// CUDA entry points of the optimizer layer, implemented by the CUDA backend in src/optim/cuda_*.cu (compiled
// into cz_optim when CZ_CUDA_ENABLED). Same contracts as the CPU kernels in cpu_kernels.h — read those
// comments — plus the stream to queue the work on; none of them may synchronise with the host. Tensors are
// contiguous, on the stream's device, f32 (f64 optional). `pieces` is host memory (a few hundred entries at
// most): pass it as kernel arguments or upload it per call; it tiles [0, p.numel()).
#pragma once

#if CZ_WITH_CUDA

#include <span>

#include "optim/kernel_args.h"
#include "optim/param_groups.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace cz::cuda {

void adamw_step(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq,
                std::span<const ShardPiece> pieces, const AdamWStepArgs& args, Stream stream);
void sgd_step(Tensor& p, const Tensor& g, Tensor& momentum_buffer, std::span<const ShardPiece> pieces,
              const SgdStepArgs& args, Stream stream);
// out: 0-d f64 on the device; written, not accumulated.
void sq_norm(const Tensor& x, Tensor& out, Stream stream);
// found: 0-d f32 on the device; set to 1 on a non-finite element, never reset. factor == 1: x is only read.
void unscale_and_check(Tensor& x, double factor, Tensor& found, Stream stream);
void ema_update(Tensor& ema, const Tensor& p, double decay, Stream stream);

}  // namespace cz::cuda

#endif  // CZ_WITH_CUDA
