// GPU health (gpu_health.h): readings summarised per log record, throttling detected, the sampler thread.
#include "dist/train/gpu_health.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <fmt/format.h>

#include "io/log/train_log.h"
#if CZ_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cz::train {

void GpuHealthTracker::add(const dist::GpuReading& r) {
  ++cur_.samples;
  if (r.util_pct >= 0) cur_.util_sum += r.util_pct, ++cur_.util_n;
  if (r.mem_util_pct >= 0) cur_.mem_util_sum += r.mem_util_pct, ++cur_.mem_util_n;
  if (r.power_w >= 0) cur_.power_sum += r.power_w, ++cur_.power_n;
  if (r.sm_clock_mhz >= 0) cur_.clock_sum += r.sm_clock_mhz, ++cur_.clock_n;
  cur_.mem_used = std::max(cur_.mem_used, r.mem_used_bytes);
  if (r.mem_total_bytes >= 0) cur_.mem_total = r.mem_total_bytes;
  cur_.temp = std::max(cur_.temp, r.temp_c);
  if (r.power_limit_w >= 0) cur_.limit = r.power_limit_w;
  if (r.reasons >= 0) cur_.reasons = std::max<int64_t>(cur_.reasons, 0) | r.reasons;
}

std::optional<std::string> GpuHealthTracker::annotate(nlohmann::json& record) {
  if (record.value("split", std::string()) != "train") return std::nullopt;
  cur_.step_sum += record.value("step_time_s", 0.0);
  ++cur_.steps;
  if (cur_.samples == 0) return std::nullopt;
  record["gpu_samples"] = cur_.samples;
  if (cur_.util_n) record["gpu_util_pct"] = cur_.util_sum / cur_.util_n;
  if (cur_.mem_util_n) record["gpu_mem_util_pct"] = cur_.mem_util_sum / cur_.mem_util_n;
  if (cur_.mem_used >= 0) record["gpu_mem_used_gb"] = cur_.mem_used / 1e9;
  if (cur_.mem_total >= 0) record["gpu_mem_total_gb"] = cur_.mem_total / 1e9;
  if (cur_.temp >= 0) record["gpu_temp_c"] = cur_.temp;
  if (cur_.power_n) record["gpu_power_w"] = cur_.power_sum / cur_.power_n;
  if (cur_.limit >= 0) record["gpu_power_limit_w"] = cur_.limit;
  if (cur_.clock_n) record["gpu_sm_clock_mhz"] = cur_.clock_sum / cur_.clock_n;
  std::optional<std::string> line;
  if (cur_.reasons >= 0) {
    const uint64_t throttle = uint64_t(cur_.reasons) & dist::nvml_reason::kThrottling;
    record["gpu_throttle"] = throttle ? 1 : 0;
    record["gpu_clock_reasons"] = dist::nvml_reason_names(uint64_t(cur_.reasons));
    const double step_s = cur_.step_sum / cur_.steps;
    const int64_t step = record.value("step", int64_t(0));
    if (throttle && !throttling_) {
      line = fmt::format(
          "{} started throttling by step {}: {} (power {} of its {} W cap, {} C, SM {} MHz); step time {} "
          "before, "
          "{:.4f} s after",
          who_, step, dist::nvml_reason_names(throttle),
          cur_.power_n ? fmt::format("{:.0f} W", cur_.power_sum / cur_.power_n) : std::string("?"),
          cur_.limit >= 0 ? fmt::format("{:.0f}", cur_.limit) : std::string("?"),
          cur_.temp >= 0 ? fmt::format("{:.0f}", cur_.temp) : std::string("?"),
          cur_.clock_n ? fmt::format("{:.0f}", cur_.clock_sum / cur_.clock_n) : std::string("?"),
          last_clear_step_s_ >= 0 ? fmt::format("{:.4f} s", last_clear_step_s_)
                                  : std::string("unknown (from the start)"),
          step_s);
    } else if (!throttle && throttling_) {
      line = fmt::format("{} stopped throttling by step {}; step time {:.4f} s now", who_, step, step_s);
    }
    throttling_ = throttle != 0;
    if (!throttling_) last_clear_step_s_ = step_s;
  }
  cur_ = Interval{};
  return line;
}

GpuHealth::GpuHealth(std::unique_ptr<dist::Nvml> nvml, void* device, double period_s, std::string who)
    : nvml_(std::move(nvml)), device_(device), period_s_(period_s), tracker_(std::move(who)) {
  name_ = nvml_->device_name(device_);
  driver_ = nvml_->driver_version();
  thread_ = std::thread([this] { run(); });
}

GpuHealth::~GpuHealth() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::unique_ptr<GpuHealth> GpuHealth::start(const std::string& busid, int index, double period_s,
                                            std::string who, std::string* why) {
  std::unique_ptr<dist::Nvml> nvml = dist::Nvml::open(why);
  if (!nvml) return nullptr;
  void* device = nvml->device(busid, index, why);
  if (!device) return nullptr;
  return std::unique_ptr<GpuHealth>(new GpuHealth(std::move(nvml), device, period_s, std::move(who)));
}

// A reading at once, then one per period. NVML's calls take microseconds to a millisecond and never touch
// the device's streams, so the sampler costs the step nothing measurable.
void GpuHealth::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    const dist::GpuReading r = nvml_->read(device_);
    lock.lock();
    tracker_.add(r);
    cv_.wait_for(lock, std::chrono::duration<double>(period_s_), [&] { return stop_; });
  }
}

std::optional<std::string> GpuHealth::annotate(nlohmann::json& record) {
  std::lock_guard lock(mu_);
  return tracker_.annotate(record);
}

std::unique_ptr<GpuHealth> start_gpu_health(bool cuda_rank, int cuda_device, int rank) {
  const char* lib = std::getenv("CZ_NVML_LIBRARY");
  const bool stand_in = lib && *lib;
  if (!cuda_rank && !stand_in) return nullptr;
  double period_s = 1.0;
  if (const char* p = std::getenv("CZ_GPU_HEALTH_PERIOD_S"); p && *p) period_s = std::max(1e-3, std::atof(p));
  std::string busid;
#if CZ_WITH_CUDA
  char buf[64] = {0};
  if (cuda_rank && cudaDeviceGetPCIBusId(buf, sizeof buf, cuda_device) == cudaSuccess) busid = buf;
#endif
  const int index = cuda_rank ? cuda_device : 0;
  const std::string who =
      fmt::format("rank {}: GPU {}{}", rank, index, busid.empty() ? std::string() : " (" + busid + ")");
  std::string why;
  auto health = GpuHealth::start(busid, index, period_s, who, &why);
  if (!health && rank == 0)
    console_print(stderr, fmt::format("# GPU health: not sampled ({}); the log has no gpu_* fields\n", why));
  return health;
}

void note_gpu_health(GpuHealth* health, nlohmann::json& record) {
  if (!health) return;
  if (std::optional<std::string> line = health->annotate(record)) console_print(stderr, *line + "\n");
}

}  // namespace cz::train
