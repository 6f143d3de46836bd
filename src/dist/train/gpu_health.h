// A GPU's health in the log: on a CUDA rank a background thread reads NVML (dist/comm/nvml.h)
// every period; each train record after new readings carries their summary (gpu_* fields, and so
// TensorBoard's train/gpu_*), and a line is printed when the GPU starts or stops throttling, with the step
// time before and after.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "dist/comm/nvml.h"

namespace cz::train {

// Note [GPU health fields]: a train record gets, over the readings taken since the previous record that got
// them (none: no fields), gpu_samples (their count), gpu_util_pct and gpu_mem_util_pct (mean),
// gpu_mem_used_gb (most), gpu_mem_total_gb, gpu_temp_c (highest), gpu_power_w (mean), gpu_power_limit_w
// (last), gpu_sm_clock_mhz (mean), gpu_throttle (1 when any reading had a throttling reason: power cap,
// thermal or hardware slowdown; else 0) and gpu_clock_reasons (every reason seen, by name:
// "sw_power_cap,gpu_idle"; a string, so not in TensorBoard). A figure the device does not report is left out.
// Throttling starts when an interval has a throttling reason after one without; the line names the reasons
// and gives the mean step time of the last interval without (before) and of this one (after), which may still
// hold unthrottled steps from before the reason appeared.
class GpuHealthTracker {
 public:
  explicit GpuHealthTracker(std::string who) : who_(std::move(who)) {}
  void add(const dist::GpuReading& r);
  // For a train record (split "train", step, step_time_s): counts its step, and when readings came since the
  // last record that got them, writes Note [GPU health fields] into it. Returns the line to print when the
  // throttling state changed.
  std::optional<std::string> annotate(nlohmann::json& record);

 private:
  struct Interval {  // since the last record that got the fields
    int samples = 0;
    double util_sum = 0, mem_util_sum = 0, power_sum = 0, clock_sum = 0;
    int util_n = 0, mem_util_n = 0, power_n = 0, clock_n = 0;
    double mem_used = -1, mem_total = -1, temp = -1, limit = -1;
    int64_t reasons = -1;
    double step_sum = 0;
    int steps = 0;
  };
  std::string who_;
  Interval cur_;
  bool throttling_ = false;
  double last_clear_step_s_ = -1;  // mean step time of the last interval without throttling
};

// The tracker fed by a thread that reads one device every `period_s`. Destruction stops the thread.
class GpuHealth {
 public:
  // NVML's device at `busid` (else at `index`), or nullptr with `why` saying why not.
  static std::unique_ptr<GpuHealth> start(const std::string& busid, int index, double period_s,
                                          std::string who, std::string* why);
  ~GpuHealth();
  GpuHealth(const GpuHealth&) = delete;
  GpuHealth& operator=(const GpuHealth&) = delete;
  std::optional<std::string> annotate(nlohmann::json& record);
  const std::string& device_name() const { return name_; }
  const std::string& driver_version() const { return driver_; }

 private:
  GpuHealth(std::unique_ptr<dist::Nvml> nvml, void* device, double period_s, std::string who);
  void run();
  std::unique_ptr<dist::Nvml> nvml_;
  void* device_;
  double period_s_;
  std::string name_, driver_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  GpuHealthTracker tracker_;
  std::thread thread_;
};

// What the trainer starts (Trainer::open_log): on a CUDA rank its device's sampler, and on any rank when
// $CZ_NVML_LIBRARY names a library (the tests' stand-in: device 0); nullptr otherwise, or when NVML cannot
// be used, which rank 0 says in one line. The period is 1 s, or $CZ_GPU_HEALTH_PERIOD_S.
std::unique_ptr<GpuHealth> start_gpu_health(bool cuda_rank, int cuda_device, int rank);
// The trainer's hook for a record: annotates it and prints the throttling line, if any, on stderr.
void note_gpu_health(GpuHealth* health, nlohmann::json& record);

}  // namespace cz::train
