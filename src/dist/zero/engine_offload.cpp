// CPU optimizer offload.
//
// Note [CPU offload]: with --offload-optimizer the fp32 master chunks, the fp32 gradient chunks and the
// optimizer state live in pinned host memory; the device keeps the compute copy (and, at stages 0-1, the
// gradient buffer the .grads accumulate into). As each bucket's reduction finishes, a job on the HostWorker
// thread copies this rank's reduced chunk to the host (CUDA: after an event of the compute stream, on the
// worker's own stream; on the CPU backend the main thread copies it) and, when nothing needs the whole
// gradient first (no clipping, no fp16 overflow check, no delayed update), runs the CPU optimizer on that
// range at once, while backward goes on. engine.step() waits for the worker, then writes the updated chunks
// back to the compute copy (cast to its dtype; all- gathered at stages 1-2). Otherwise the step computes the
// global norm and the overflow decision over the host gradients and runs the optimizer over all ranges. The
// arithmetic is the same CPU AdamW either way, so offload changes no bit on the CPU backend (tested).
//
// --offload-overlap-step is ZeRO-Offload's delayed parameter update: the optimizer of step t is a worker job
// that runs while the device computes step t+1, whose forward and backward therefore see the weights of step
// t-1: one step stale. The worker runs jobs in order, so step t+1's gradient copies wait for step t's update
// (their device buckets stay alive meanwhile). synchronize() brings the last update to the device before
// evaluation, export or a checkpoint.
#include <chrono>

#include "dist/zero/engine.h"
#include "dist/zero/host_worker.h"
#include "tensor/autograd/engine.h"

namespace cz::zero {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

void ZeroEngine::offload_grad_chunk(size_t p, const Tensor& chunk, bool accumulate) {
  const int64_t off = layout_.local_offset(p), c = layout_.chunk(p);
  const bool update = eager_update_ && last_micro_;
  auto copy_in = [this, chunk, accumulate, off, c] {
    NoGradGuard no_grad;
    const auto t0 = Clock::now();
    Tensor dst = grad_shard_.narrow(0, off, c);
    Tensor src = chunk.dtype() == DType::f32 ? chunk : chunk.to(DType::f32);
    if (accumulate)
      dst.add_(src.is_cpu() ? src : src.to(Device::cpu()));
    else
      dst.copy_(src);
    copy_s_ += since(t0);
  };
  auto step_range = [this, p, off, c] {
    const auto t1 = Clock::now();
    optimizer_->step_range(p, master_.narrow(0, off, c), grad_shard_.narrow(0, off, c), lr_);
    optim_s_ += since(t1);
  };
  // On the CPU the copy is a memcpy of one chunk: done here, the bucket is freed at once (the memory profile
  // of a run without offload, which the planner counts on) and only the update goes to the worker. Not under
  // the delayed update, whose previous step's job may still be reading the host gradients: there the worker's
  // order keeps the copies behind it.
  if (chunk.is_cpu() && !cfg_.offload_overlap_step) {
    copy_in();
    if (update) worker_->submit(step_range);
    return;
  }
  std::shared_ptr<Event> ready;
  if (chunk.is_cuda()) {
    ready = std::make_shared<Event>(chunk.device());
    ready->record(current_stream(chunk.device()));
  }
  worker_->submit([this, ready, copy_in, step_range, update] {
    if (ready) ready->wait(worker_->stream());
    copy_in();
    if (update) step_range();
  });
}

void ZeroEngine::offload_step(LossScaler& scaler) {
  const auto t0 = Clock::now();
  worker_->drain();
  stats_.offload_wait_s = since(t0);
  if (update_pending_) {  // the previous step's delayed update has finished: to the device with it
    refresh_compute();
    update_pending_ = false;
  }
  const std::vector<Tensor> g = master_grads(), w = master_params();
  auto ema_update = [this, w] {
    if (ema_) ema_->update(std::span<const Tensor>(w), cfg_.ema_decay);
  };
  if (eager_update_) {
    optimizer_->end_step();
    const auto t1 = Clock::now();
    ema_update();
    optim_s_ += since(t1);
    stats_.grad_norm = global_grad_norm(g);
    refresh_compute();
  } else if (prepare_gradients(g, scaler)) {
    auto update = [this, g, w, ema_update, lr = lr_] {
      NoGradGuard no_grad;
      const auto t1 = Clock::now();
      optimizer_->step(std::span<const Tensor>(w), std::span<const Tensor>(g), lr);
      ema_update();
      optim_s_ += since(t1);
    };
    if (cfg_.offload_overlap_step) {
      worker_->submit(update);
      update_pending_ = true;
    } else {
      update();
      refresh_compute();
    }
  }
  stats_.offload_copy_s = copy_s_;
  stats_.offload_optimizer_s = optim_s_;
}

void ZeroEngine::synchronize() {
  wait_all_param_gathers();
  if (!worker_) return;
  worker_->drain();
  if (update_pending_) {
    refresh_compute();
    update_pending_ = false;
  }
  wait_all_param_gathers();
}

}  // namespace cz::zero
