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

WeightEma::WeightEma(const Tensor& params, double decay) : decay_(decay) {
  check_decay("WeightEma", decay);
  CZ_CHECK(params.defined(), "WeightEma: params is an undefined tensor");
  CZ_CHECK_DTYPE(params.dtype() == DType::f32 || params.dtype() == DType::f64,
                 "WeightEma: params must be f32 or f64, got {}", dtype_name(params.dtype()));
  CZ_CHECK_SHAPE(params.is_contiguous(), "WeightEma: params of shape {} must be contiguous",
                 shape_str(params.sizes()));
  NoGradGuard no_grad;
  ema_ = params.detach().clone();
}

void WeightEma::check_params(const char* op, const Tensor& params) const {
  CZ_CHECK(params.defined(), "{}: params is an undefined tensor", op);
  CZ_CHECK_SHAPE(params.sizes() == ema_.sizes() && params.is_contiguous(),
                 "{}: params has shape {} (contiguous: {}) but the EMA has shape {}", op,
                 shape_str(params.sizes()), params.is_contiguous(), shape_str(ema_.sizes()));
  CZ_CHECK_DTYPE(params.dtype() == ema_.dtype(), "{}: params is {} but the EMA is {}", op,
                 dtype_name(params.dtype()), dtype_name(ema_.dtype()));
  CZ_CHECK_DEVICE(params.device() == ema_.device(), "{}: params is on {} but the EMA is on {}", op,
                  params.device().str(), ema_.device().str());
}

void WeightEma::update(const Tensor& params) {
  update(params, decay_);
}

void WeightEma::update(const Tensor& params, double decay) {
  check_decay("WeightEma::update", decay);
  check_params("WeightEma::update", params);
  CZ_CHECK(!swapped_, "WeightEma::update: the EMA weights are swapped in; swap back before updating");
  if (ema_.is_cpu())
    cpu::ema_update(ema_, params, decay);
  else
    CZ_CUDA_CALL(cuda::ema_update(ema_, params, decay, current_stream(ema_.device())));
  ema_.storage()->bump_version();
}

void WeightEma::swap(const Tensor& params) {
  check_params("WeightEma::swap", params);
  NoGradGuard no_grad;
  Tensor live = params.detach();
  Tensor tmp = live.clone();
  live.copy_(ema_);
  ema_.copy_(tmp);
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
