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
// skip (0-d f32 on the device, or undefined): nothing is updated where skip != 0.
void ema_update(Tensor& ema, const Tensor& p, double decay, Stream stream, const Tensor& skip = Tensor());

// The device-scalar variants (Note [The optimizer's device scalars] in device_scalars.h): `scalars` is the
// f64 buffer of optim_scalars::kSlots, `found` the 0-d f32 overflow flag, both on the stream's device. The
// updates read lr, the bias corrections (AdamW) and the first-step flag (SGD) from scalars and skip where
// found != 0; args give only the step's constants (betas, eps; momentum, dampening, nesterov).
void adamw_step_dev(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq,
                    std::span<const ShardPiece> pieces, const AdamWStepArgs& args, const Tensor& scalars,
                    const Tensor& found, Stream stream);
void sgd_step_dev(Tensor& p, const Tensor& g, Tensor& momentum_buffer, std::span<const ShardPiece> pieces,
                  const SgdStepArgs& args, const Tensor& scalars, const Tensor& found, Stream stream);
// x *= scalars[kInvScale]; found = 1 on a non-finite element (never reset here).
void unscale_and_check_dev(Tensor& x, const Tensor& scalars, Tensor& found, Stream stream);
// scalars[kNorm], [kFound], [kClipCoef] from the summed squares sq (0-d f64) and found; max_norm <= 0: none.
void clip_scalars(const Tensor& sq, const Tensor& found, double max_norm, Tensor& scalars, Stream stream);
// x *= scalars[kClipCoef] unless found != 0.
void scale_dev(Tensor& x, const Tensor& scalars, const Tensor& found, Stream stream);

}  // namespace cz::cuda

#endif  // CZ_WITH_CUDA
