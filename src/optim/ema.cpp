// WeightEma: argument checks, the update dispatch, swapping, and state.
#include "optim/ema.h"

#include "optim/cpu_kernels.h"
#include "optim/cuda_kernels.h"
#include "tensor/autograd/engine.h"
#include "tensor/dispatch.h"
#include "tensor/stream.h"

namespace cz {
namespace {

void check_decay(const char* op, double decay) {
  CZ_CHECK(decay >= 0 && decay <= 1, "{}: decay must be in [0, 1], got {}", op, decay);
}

}  // namespace

WeightEma::WeightEma(std::span<const Tensor> params, double decay) : decay_(decay) {
  check_decay("WeightEma", decay);
  CZ_CHECK(!params.empty(), "WeightEma: no params");
  int64_t n = 0;
  for (const Tensor& p : params) {
    CZ_CHECK(p.defined(), "WeightEma: params is an undefined tensor");
    CZ_CHECK_DTYPE(p.dtype() == DType::f32 || p.dtype() == DType::f64,
                   "WeightEma: params must be f32 or f64, got {}", dtype_name(p.dtype()));
    CZ_CHECK_SHAPE(p.is_contiguous(), "WeightEma: params of shape {} must be contiguous",
                   shape_str(p.sizes()));
    CZ_CHECK_SHAPE(params.size() == 1 || p.dim() == 1, "WeightEma: pieces must be 1-D, got {}",
                   shape_str(p.sizes()));
    n += p.numel();
  }
  NoGradGuard no_grad;
  if (params.size() == 1) {
    ema_ = params[0].detach().clone();
    return;
  }
  ema_ = empty({n}, params[0].dtype(), params[0].device());
  int64_t off = 0;
  for (const Tensor& p : params) {
    ema_.narrow(0, off, p.numel()).copy_(p.detach());
    off += p.numel();
  }
}

void WeightEma::check_params(const char* op, std::span<const Tensor> params) const {
  int64_t n = 0;
  for (const Tensor& p : params) {
    CZ_CHECK(p.defined(), "{}: params is an undefined tensor", op);
    CZ_CHECK_SHAPE(p.is_contiguous() && (params.size() == 1 ? p.sizes() == ema_.sizes() : p.dim() == 1),
                   "{}: params has shape {} (contiguous: {}) but the EMA has shape {}", op,
                   shape_str(p.sizes()), p.is_contiguous(), shape_str(ema_.sizes()));
    CZ_CHECK_DTYPE(p.dtype() == ema_.dtype(), "{}: params is {} but the EMA is {}", op, dtype_name(p.dtype()),
                   dtype_name(ema_.dtype()));
    CZ_CHECK_DEVICE(p.device() == ema_.device(), "{}: params is on {} but the EMA is on {}", op,
                    p.device().str(), ema_.device().str());
    n += p.numel();
  }
  CZ_CHECK_SHAPE(n == ema_.numel(), "{}: params hold {} elements but the EMA has {}", op, n, ema_.numel());
}

void WeightEma::update(const Tensor& params) {
  update(params, decay_);
}

void WeightEma::update(std::span<const Tensor> params, double decay, const Tensor& skip) {
  check_decay("WeightEma::update", decay);
  check_params("WeightEma::update", params);
  CZ_CHECK(!swapped_, "WeightEma::update: the EMA weights are swapped in; swap back before updating");
  int64_t off = 0;
  for (const Tensor& p : params) {
    Tensor e = params.size() == 1 ? ema_ : ema_.narrow(0, off, p.numel());
    off += p.numel();
    CZ_CHECK(!skip.defined() || !e.is_cpu(), "WeightEma::update: a device skip flag needs a CUDA EMA");
    if (e.is_cpu())
      cpu::ema_update(e, p, decay);
    else
      CZ_CUDA_CALL(cuda::ema_update(e, p, decay, current_stream(e.device()), skip));
  }
  ema_.storage()->bump_version();
}

void WeightEma::swap(std::span<const Tensor> params) {
  check_params("WeightEma::swap", params);
  NoGradGuard no_grad;
  int64_t off = 0;
  for (const Tensor& p : params) {
    Tensor e = params.size() == 1 ? ema_ : ema_.narrow(0, off, p.numel());
    off += p.numel();
    Tensor live = p.detach();
    Tensor tmp = live.clone();
    live.copy_(e);
    e.copy_(tmp);
  }
  swapped_ = !swapped_;
}

NamedTensors WeightEma::state() const {
  CZ_CHECK(!swapped_, "WeightEma::state: the EMA weights are swapped in; swap back before saving");
  return {{"ema", ema_}};
}

void WeightEma::load_state(const NamedTensors& state) {
  CZ_CHECK(!swapped_, "WeightEma::load_state: the EMA weights are swapped in; swap back before loading");
  CZ_CHECK_IO(state.size() == 1 && state[0].first == "ema" && state[0].second.defined(),
              "WeightEma::load_state: expected exactly one state 'ema', got {} entries", state.size());
  const Tensor& t = state[0].second;
  CZ_CHECK_IO(t.sizes() == ema_.sizes(), "WeightEma::load_state: 'ema' has shape {} but the EMA has shape {}",
              shape_str(t.sizes()), shape_str(ema_.sizes()));
  ema_.copy_(t);
}

}  // namespace cz
