// A step's statistics as its JSON log line.
#include "dist/zero/step_stats.h"

namespace cz::zero {

nlohmann::json to_json(const StepStats& s) {
  nlohmann::json j = {{"step", s.step},
                      {"epoch", s.epoch},
                      {"loss", s.loss},
                      {"lr", s.lr},
                      {"grad_norm", s.grad_norm},
                      {"step_time_s", s.step_time_s},
                      {"data_wait_s", s.data_wait_s},
                      {"img_per_s", s.img_per_s},
                      {"peak_mem_bytes", s.peak_mem_bytes},
                      {"stage", s.stage},
                      {"comm_bytes", s.comm_bytes},
                      {"comm_cross_bytes", s.comm_cross_bytes},
                      {"comm_s", s.comm_s},
                      {"comm_exposed_s", s.comm_exposed_s},
                      {"model_state_bytes", s.model_state_bytes},
                      {"comm_buffer_bytes", s.comm_buffer_bytes}};
  if (s.offload) {
    j["offload_copy_s"] = s.offload_copy_s;
    j["offload_optimizer_s"] = s.offload_optimizer_s;
    j["offload_wait_s"] = s.offload_wait_s;
  }
  if (s.loss_scaling) {
    j["loss_scale"] = s.loss_scale;
    j["skipped"] = s.skipped;
  }
  return j;
}

}  // namespace cz::zero
