// The offload worker: with --offload-optimizer, the part that takes each reduced gradient chunk to the
// host-resident sharded state and runs the CPU optimizer on it, on a HostWorker thread (Note [CPU offload]).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "dist/zero/host_worker.h"
#include "dist/zero/sharded_state.h"

namespace cz::zero {

class OffloadWorker {
 public:
  // `delayed`: --offload-overlap-step (the update of step t runs during step t+1).
  OffloadWorker(ShardedState& state, const ZeroLayout& layout, Device device, bool delayed);
  ~OffloadWorker();  // drains; never throws

  // After the state's begin_step. `gradients_first`: the step needs every gradient before any update
  // (clipping, an fp16 overflow check), so ranges are not updated as they arrive.
  void begin_step(bool gradients_first);
  // The reducer's hand-off: partition p's reduced chunk (device or host), `final` on the step's last
  // micro-step.
  void receive(size_t p, const Tensor& chunk, bool final);
  // The step's end: waits for the worker, then the update (now, or queued under the delayed update).
  // `refresh` brings the compute copy up to date with the master chunks.
  void step(LossScaler& scaler, StepStats& s, const std::function<void()>& refresh);
  // Waits for every job; whether a delayed update finished that the compute copy has not seen yet (cleared).
  bool drain();

 private:
  ShardedState& state_;
  const ZeroLayout& layout_;
  bool delayed_ = false;
  std::unique_ptr<HostWorker> worker_;
  std::vector<bool> fresh_;      // the partition's host gradient not yet written this step
  bool eager_ = false;           // each range updated as soon as its gradient is on the host
  bool update_pending_ = false;  // delayed: an update not yet copied to the device
  std::atomic<double> copy_s_{0}, optim_s_{0};
};

}  // namespace cz::zero
