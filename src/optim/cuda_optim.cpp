// Host side of the optimizer's CUDA entry points (cuda_kernels.h): checks, per-piece constants rounded as the
// CPU kernels round them, pieces passed to the kernels by value in batches, workspaces from the caching
// allocator. Nothing here waits on the device.
#include <cmath>
#include <initializer_list>
#include <utility>

#include "optim/cuda_kernels.h"
#include "optim/cuda_launch.h"
#include "optim/device_scalars.h"
#include "tensor/cuda/host_utils.h"

namespace cz::cuda {

using detail::check_operand;

namespace {

void check_f32_f64(const char* op, const Tensor& t) {
  CZ_CHECK_DTYPE(t.dtype() == DType::f32 || t.dtype() == DType::f64, "cuda::{}: f32 or f64 expected, got {}",
                 op, dtype_name(t.dtype()));
}

// An update's operands: p in f32 or f64, and p, g and the named state buffers all of p's dtype and size.
void check_update(const char* op, const Tensor& p, const Tensor& g,
                  std::initializer_list<std::pair<const char*, const Tensor*>> state, Stream stream) {
  check_f32_f64(op, p);
  check_operand(op, "p", p, p.dtype(), stream, p.numel());
  check_operand(op, "g", g, p.dtype(), stream, p.numel());
  for (const auto& [what, t] : state) check_operand(op, what, *t, p.dtype(), stream, p.numel());
}

// Calls launch_batch(batch) for consecutive batches of at most kMaxOptimPieces pieces, with fill(piece,
// batch, slot) setting each slot's constants. The kernels find an element's piece by binary search, so the
// pieces must be sorted and disjoint (as shard_pieces makes them); anything else would silently update some
// elements with another piece's hyper-parameters, or skip them.
template <class Fill, class Launch>
void for_piece_batches(std::span<const ShardPiece> pieces, int64_t n, Fill&& fill, Launch&& launch_batch) {
  launch::OptimPieces batch;
  int64_t prev_end = 0;
  for (const ShardPiece& piece : pieces) {
    CZ_CHECK_SHAPE(piece.begin >= 0 && piece.begin <= piece.end && piece.end <= n,
                   "cuda optimizer: piece [{}, {}) outside the shard of {} elements", piece.begin, piece.end,
                   n);
    if (piece.begin == piece.end) continue;
    CZ_CHECK_SHAPE(piece.begin >= prev_end,
                   "cuda optimizer: piece [{}, {}) starts before the previous piece's end {} (pieces must be "
                   "sorted and disjoint)",
                   piece.begin, piece.end, prev_end);
    prev_end = piece.end;
    const int s = batch.count++;
    batch.begin[s] = piece.begin;
    batch.end[s] = piece.end;
    fill(piece, batch, s);
    if (batch.count == launch::kMaxOptimPieces) {
      launch_batch(batch);
      batch.count = 0;
    }
  }
  if (batch.count > 0) launch_batch(batch);
}

}  // namespace

void adamw_step(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq,
                std::span<const ShardPiece> pieces, const AdamWStepArgs& args, Stream stream) {
  constexpr const char* op = "adamw_step";
  check_update(op, p, g, {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}}, stream);
  const int64_t n = p.numel();
  const auto [bc1, inv_sqrt_bc2] = optim_scalars::adamw_bias_corrections(args.beta1, args.beta2, args.step);
  const launch::AdamWConstants c{1.0 - args.beta1, args.beta2, 1.0 - args.beta2, inv_sqrt_bc2, args.eps};
  DeviceGuard guard(stream.device.index);
  const launch::Config cfg = detail::config_of(stream);
  for_piece_batches(
      pieces, n,
      [&](const ShardPiece& piece, launch::OptimPieces& b, int s) {
        const double lr = args.lr * piece.lr_scale;
        b.a[s] = 1.0 - lr * piece.weight_decay;
        b.b[s] = -(lr / bc1);
      },
      [&](const launch::OptimPieces& b) {
        CZ_CHECK_STATUS(launch::adamw_step(cfg, p.dtype(), p.raw_data(), g.raw_data(), exp_avg.raw_data(),
                                           exp_avg_sq.raw_data(), b, c));
      });
}

void sgd_step(Tensor& p, const Tensor& g, Tensor& momentum_buffer, std::span<const ShardPiece> pieces,
              const SgdStepArgs& args, Stream stream) {
  constexpr const char* op = "sgd_step";
  check_update(op, p, g, {}, stream);
  const int64_t n = p.numel();
  const bool use_momentum = args.momentum != 0.0;
  if (use_momentum) check_operand(op, "momentum_buffer", momentum_buffer, p.dtype(), stream, n);
  const launch::SgdConstants c{args.momentum, 1.0 - args.dampening, use_momentum, args.nesterov,
                               args.first_step};
  DeviceGuard guard(stream.device.index);
  const launch::Config cfg = detail::config_of(stream);
  for_piece_batches(
      pieces, n,
      [&](const ShardPiece& piece, launch::OptimPieces& b, int s) {
        b.a[s] = piece.weight_decay;
        b.b[s] = -(args.lr * piece.lr_scale);
      },
      [&](const launch::OptimPieces& b) {
        CZ_CHECK_STATUS(launch::sgd_step(cfg, p.dtype(), p.raw_data(), g.raw_data(),
                                         use_momentum ? momentum_buffer.raw_data() : nullptr, b, c));
      });
}

void sq_norm(const Tensor& x, Tensor& out, Stream stream) {
  check_f32_f64("sq_norm", x);
  check_operand("sq_norm", "x", x, x.dtype(), stream, x.numel());
  check_operand("sq_norm", "out", out, DType::f64, stream, 1);
  DeviceGuard guard(stream.device.index);
  DataPtr ws = allocate(launch::sq_norm_workspace(x.numel()), stream);
  CZ_CHECK_STATUS(launch::sq_norm(detail::config_of(stream), x.dtype(), x.raw_data(), x.numel(),
                                  static_cast<double*>(out.raw_data()), ws.get()));
}

void unscale_and_check(Tensor& x, double factor, Tensor& found, Stream stream) {
  check_f32_f64("unscale_and_check", x);
  check_operand("unscale_and_check", "x", x, x.dtype(), stream, x.numel());
  check_operand("unscale_and_check", "found", found, DType::f32, stream, 1);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::unscale_and_check(detail::config_of(stream), x.dtype(), x.raw_data(), x.numel(),
                                            factor, static_cast<float*>(found.raw_data())));
}

void ema_update(Tensor& ema, const Tensor& p, double decay, Stream stream, const Tensor& skip) {
  check_f32_f64("ema_update", ema);
  check_operand("ema_update", "ema", ema, ema.dtype(), stream, ema.numel());
  check_operand("ema_update", "p", p, ema.dtype(), stream, ema.numel());
  if (skip.defined()) check_operand("ema_update", "skip", skip, DType::f32, stream, 1);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::ema_update(detail::config_of(stream), ema.dtype(), ema.raw_data(), p.raw_data(),
                                     ema.numel(), decay,
                                     skip.defined() ? static_cast<const float*>(skip.raw_data()) : nullptr));
}

// ---- the device-scalar variants (Note [The optimizer's device scalars]) ----

namespace {

void check_scalars(const char* op, const Tensor& scalars, const Tensor& found, Stream stream) {
  check_operand(op, "scalars", scalars, DType::f64, stream, optim_scalars::kSlots);
  check_operand(op, "found", found, DType::f32, stream, 1);
}

const double* scalars_of(const Tensor& scalars) {
  return static_cast<const double*>(scalars.raw_data());
}
const float* found_of(const Tensor& found) {
  return static_cast<const float*>(found.raw_data());
}

// Each piece's lr_scale and weight_decay, for the kernels to make their constants from the device's lr.
void fill_piece_hypers(const ShardPiece& piece, launch::OptimPieces& b, int s) {
  b.a[s] = piece.lr_scale;
  b.b[s] = piece.weight_decay;
}

}  // namespace

void adamw_step_dev(Tensor& p, const Tensor& g, Tensor& exp_avg, Tensor& exp_avg_sq,
                    std::span<const ShardPiece> pieces, const AdamWStepArgs& args, const Tensor& scalars,
                    const Tensor& found, Stream stream) {
  constexpr const char* op = "adamw_step_dev";
  check_update(op, p, g, {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}}, stream);
  const int64_t n = p.numel();
  check_scalars(op, scalars, found, stream);
  const launch::AdamWConstants c{1.0 - args.beta1, args.beta2, 1.0 - args.beta2, 0.0, args.eps};
  DeviceGuard guard(stream.device.index);
  const launch::Config cfg = detail::config_of(stream);
  for_piece_batches(pieces, n, fill_piece_hypers, [&](const launch::OptimPieces& b) {
    CZ_CHECK_STATUS(launch::adamw_step_dev(cfg, p.dtype(), p.raw_data(), g.raw_data(), exp_avg.raw_data(),
                                           exp_avg_sq.raw_data(), b, c, scalars_of(scalars),
                                           found_of(found)));
  });
}

void sgd_step_dev(Tensor& p, const Tensor& g, Tensor& momentum_buffer, std::span<const ShardPiece> pieces,
                  const SgdStepArgs& args, const Tensor& scalars, const Tensor& found, Stream stream) {
  constexpr const char* op = "sgd_step_dev";
  check_update(op, p, g, {}, stream);
  const int64_t n = p.numel();
  const bool use_momentum = args.momentum != 0.0;
  if (use_momentum) check_operand(op, "momentum_buffer", momentum_buffer, p.dtype(), stream, n);
  check_scalars(op, scalars, found, stream);
  const launch::SgdConstants c{args.momentum, 1.0 - args.dampening, use_momentum, args.nesterov, false};
  DeviceGuard guard(stream.device.index);
  const launch::Config cfg = detail::config_of(stream);
  for_piece_batches(pieces, n, fill_piece_hypers, [&](const launch::OptimPieces& b) {
    CZ_CHECK_STATUS(launch::sgd_step_dev(cfg, p.dtype(), p.raw_data(), g.raw_data(),
                                         use_momentum ? momentum_buffer.raw_data() : nullptr, b, c,
                                         scalars_of(scalars), found_of(found)));
  });
}

void unscale_and_check_dev(Tensor& x, const Tensor& scalars, Tensor& found, Stream stream) {
  constexpr const char* op = "unscale_and_check_dev";
  check_f32_f64(op, x);
  check_operand(op, "x", x, x.dtype(), stream, x.numel());
  check_scalars(op, scalars, found, stream);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::unscale_and_check(detail::config_of(stream), x.dtype(), x.raw_data(), x.numel(),
                                            1.0, static_cast<float*>(found.raw_data()),
                                            scalars_of(scalars) + optim_scalars::kInvScale));
}

void clip_scalars(const Tensor& sq, const Tensor& found, double max_norm, Tensor& scalars, Stream stream) {
  constexpr const char* op = "clip_scalars";
  check_operand(op, "sq", sq, DType::f64, stream, 1);
  check_scalars(op, scalars, found, stream);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::clip_scalars(detail::config_of(stream), static_cast<const double*>(sq.raw_data()),
                                       found_of(found), max_norm, static_cast<double*>(scalars.raw_data())));
}

void scale_dev(Tensor& x, const Tensor& scalars, const Tensor& found, Stream stream) {
  constexpr const char* op = "scale_dev";
  check_f32_f64(op, x);
  check_operand(op, "x", x, x.dtype(), stream, x.numel());
  check_scalars(op, scalars, found, stream);
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::scale_dev(detail::config_of(stream), x.dtype(), x.raw_data(), x.numel(),
                                    scalars_of(scalars), found_of(found)));
}

}  // namespace cz::cuda
