// One optimizer step's statistics: the engine's parts fill in the communication, memory and offload figures,
// the trainer the loss, rate and times; the same struct goes to the JSON log and into the run's summary.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace cz::zero {

struct StepStats {
  // The trainer's.
  int64_t step = 0;   // 1-based optimizer step
  int64_t epoch = 0;  // the loader's epoch when the step ended
  int stage = 0;      // the ZeRO stage it ran at
  double loss = 0;    // mean training loss of the step's global batch, before the update
  double lr = 0;
  double loss_scale = 1;
  bool loss_scaling = false;  // fp16: loss_scale and skipped are logged
  double step_time_s = 0;
  double img_per_s = 0;        // global images per second
  int64_t peak_mem_bytes = 0;  // this rank's peak allocated bytes on its device during the step
  double data_wait_s = 0;      // of step_time_s, the time this rank waited for the loader's batches

  // The engine's (Note [ZeRO step]).
  double grad_norm = 0;    // global L2 norm of the averaged, unscaled gradient, before clipping
  bool skipped = false;    // fp16 overflow on some rank: no rank updated
  int64_t comm_bytes = 0;  // bytes this rank sent in the step's collectives (ring algorithms' count)
  // Of comm_bytes, this rank's share of what its rings send from one host to another (CommMeter::sent): the
  // sum over a host's ranks is what leaves the host, R x rank 0's with R ranks per host on a mesh.
  int64_t comm_cross_bytes = 0;
  double comm_s = 0;  // time the step's collectives ran (0 where the backend does not time them)
  // Note [Exposed communication]: the part of comm_s during which the host was waiting for a collective, so
  // 0 <= comm_exposed_s <= comm_s; comm_wait_s is all the time the host waited, which also holds the hand-off
  // to the communication thread and the wake-ups.
  double comm_exposed_s = 0;
  double comm_wait_s = 0;
  int64_t comm_buffer_bytes = 0;  // peak bytes of gradient buckets and stage-3 gather buffers in the step
  int64_t model_state_bytes = 0;  // master weights, gradients, optimizer state, compute copy (this rank)
  // Offload: time the worker spent copying gradients to the host and in the CPU optimizer (and EMA), and time
  // the step waited for it.
  bool offload = false;  // the three are logged
  double offload_copy_s = 0, offload_optimizer_s = 0, offload_wait_s = 0;
};

// The step's line in the JSON log.
nlohmann::json to_json(const StepStats& s);

}  // namespace cz::zero
