// CPU optimizer offload: the OffloadWorker part (offload.h).
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
// (their device buckets stay alive meanwhile). ZeroEngine::synchronize() brings the last update to the device
// before evaluation, export or a checkpoint.
#include "dist/zero/offload.h"

#include <chrono>

#include "tensor/autograd/engine.h"

namespace cz::zero {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

OffloadWorker::OffloadWorker(ShardedState& state, const ZeroLayout& layout, Device device, bool delayed)
    : state_(state),
      layout_(layout),
      delayed_(delayed),
      worker_(std::make_unique<HostWorker>(device)),
      fresh_(layout.partitions.size(), true) {}

OffloadWorker::~OffloadWorker() {
  worker_.reset();  // drains: its jobs use the state's buffers
}

void OffloadWorker::begin_step(bool gradients_first) {
  fresh_.assign(fresh_.size(), true);
  eager_ = !delayed_ && !gradients_first;
  copy_s_ = 0;
  optim_s_ = 0;
}

void OffloadWorker::receive(size_t p, const Tensor& chunk, bool final) {
  const int64_t off = layout_.local_offset(p), c = layout_.chunk(p);
  const bool accumulate = !fresh_[p];  // a later micro-step's chunk of the same step
  fresh_[p] = false;
  const bool update = eager_ && final;
  const double lr = state_.update_args().lr;
  Tensor grads = state_.grad_shard().narrow(0, off, c), master = state_.master().narrow(0, off, c);
  auto copy_in = [this, chunk, accumulate, grads] {
    NoGradGuard no_grad;
    const auto t0 = Clock::now();
    Tensor dst = grads;
    Tensor src = chunk.dtype() == DType::f32 ? chunk : chunk.to(DType::f32);
    if (accumulate)
      dst.add_(src.is_cpu() ? src : src.to(Device::cpu()));
    else
      dst.copy_(src);
    copy_s_ += since(t0);
  };
  auto step_range = [this, p, master, grads, lr] {
    const auto t1 = Clock::now();
    state_.optimizer().step_range(p, master, grads, lr);
    optim_s_ += since(t1);
  };
  // On the CPU the copy is a memcpy of one chunk: done here, the bucket is freed at once (the memory profile
  // of a run without offload, which the planner counts on) and only the update goes to the worker. Not under
  // the delayed update, whose previous step's job may still be reading the host gradients: there the worker's
  // order keeps the copies behind it.
  if (chunk.is_cpu() && !delayed_) {
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

void OffloadWorker::step(LossScaler& scaler, StepStats& s, const std::function<void()>& refresh) {
  const auto t0 = Clock::now();
  worker_->drain();
  s.offload_wait_s = since(t0);
  if (update_pending_) {  // the previous step's delayed update has finished: to the device with it
    refresh();
    update_pending_ = false;
  }
  if (eager_) {
    state_.optimizer().end_step();
    const auto t1 = Clock::now();
    state_.update_ema();
    optim_s_ += since(t1);
    s.grad_norm = state_.global_grad_norm();
    refresh();
  } else if (state_.prepare_gradients(scaler, s)) {
    auto update = [this, lr = state_.update_args().lr] {
      NoGradGuard no_grad;
      const auto t1 = Clock::now();
      state_.optimizer().step(std::span<const Tensor>(state_.weights()),
                              std::span<const Tensor>(state_.grads()), lr);
      state_.update_ema();
      optim_s_ += since(t1);
    };
    if (delayed_) {
      worker_->submit(update);
      update_pending_ = true;
    } else {
      update();
      refresh();
    }
  }
  s.offload_copy_s = copy_s_;
  s.offload_optimizer_s = optim_s_;
}

bool OffloadWorker::drain() {
  worker_->drain();
  const bool pending = update_pending_;
  update_pending_ = false;
  return pending;
}

}  // namespace cz::zero
