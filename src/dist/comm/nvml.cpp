// Note [NVML at run time] (nvml.h): the library opened with dlopen, its functions found with dlsym.
#include "dist/comm/nvml.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include <fmt/format.h>

namespace cz::dist {
namespace {

// nvml.h's types, by their documented layout.
using Ret = int;    // nvmlReturn_t; 0 is NVML_SUCCESS
using Dev = void*;  // nvmlDevice_t
struct Utilization {
  unsigned gpu, memory;
};
struct Memory {
  unsigned long long total, free, used;
};
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;         // NVML_CLOCK_SM

}  // namespace

struct Nvml::Api {
  Ret (*init)() = nullptr;
  Ret (*shutdown)() = nullptr;
  const char* (*error_string)(Ret) = nullptr;
  Ret (*driver_version)(char*, unsigned) = nullptr;
  Ret (*by_index)(unsigned, Dev*) = nullptr;
  Ret (*by_busid)(const char*, Dev*) = nullptr;
  Ret (*name)(Dev, char*, unsigned) = nullptr;
  Ret (*utilization)(Dev, Utilization*) = nullptr;
  Ret (*memory)(Dev, Memory*) = nullptr;
  Ret (*temperature)(Dev, int, unsigned*) = nullptr;
  Ret (*power)(Dev, unsigned*) = nullptr;
  Ret (*power_limit)(Dev, unsigned*) = nullptr;
  Ret (*clock)(Dev, int, unsigned*) = nullptr;
  Ret (*reasons)(Dev, unsigned long long*) = nullptr;
};

std::string nvml_reason_names(uint64_t reasons) {
  static const std::pair<uint64_t, const char*> kNames[] = {
      {nvml_reason::kGpuIdle, "gpu_idle"},
      {nvml_reason::kApplicationsClocksSetting, "applications_clocks"},
      {nvml_reason::kSwPowerCap, "sw_power_cap"},
      {nvml_reason::kHwSlowdown, "hw_slowdown"},
      {nvml_reason::kSyncBoost, "sync_boost"},
      {nvml_reason::kSwThermalSlowdown, "sw_thermal_slowdown"},
      {nvml_reason::kHwThermalSlowdown, "hw_thermal_slowdown"},
      {nvml_reason::kHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
      {nvml_reason::kDisplayClockSetting, "display_clock"}};
  std::string out;
  uint64_t known = 0;
  for (const auto& [bit, name] : kNames) {
    known |= bit;
    if (reasons & bit) out += (out.empty() ? "" : ",") + std::string(name);
  }
  if (reasons & ~known) out += fmt::format("{}0x{:x}", out.empty() ? "" : ",", reasons & ~known);
  return out.empty() ? "none" : out;
}

Nvml::Nvml(void* handle, std::string path, std::unique_ptr<Api> api)
    : handle_(handle), path_(std::move(path)), api_(std::move(api)) {}

Nvml::~Nvml() {
  if (api_->shutdown) api_->shutdown();
  dlclose(handle_);
}

std::unique_ptr<Nvml> Nvml::open(std::string* why) {
  const char* env = std::getenv("CZ_NVML_LIBRARY");
  const std::string path = env && *env ? env : "libnvidia-ml.so.1";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    if (why) *why = fmt::format("cannot load {}: {}", path, dlerror());
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  auto sym = [&](auto& fn, std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (void* p = dlsym(h, n)) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
        return;
      }
  };
  sym(api->init, {"nvmlInit_v2", "nvmlInit"});
  sym(api->shutdown, {"nvmlShutdown"});
  sym(api->error_string, {"nvmlErrorString"});
  sym(api->driver_version, {"nvmlSystemGetDriverVersion"});
  sym(api->by_index, {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
  sym(api->by_busid, {"nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetHandleByPciBusId"});
  sym(api->name, {"nvmlDeviceGetName"});
  sym(api->utilization, {"nvmlDeviceGetUtilizationRates"});
  sym(api->memory, {"nvmlDeviceGetMemoryInfo"});
  sym(api->temperature, {"nvmlDeviceGetTemperature"});
  sym(api->power, {"nvmlDeviceGetPowerUsage"});
  sym(api->power_limit, {"nvmlDeviceGetEnforcedPowerLimit"});
  sym(api->clock, {"nvmlDeviceGetClockInfo"});
  sym(api->reasons, {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"});
  if (!api->init || !api->shutdown || (!api->by_index && !api->by_busid)) {
    if (why) *why = fmt::format("{} lacks nvmlInit_v2, nvmlShutdown or nvmlDeviceGetHandleByIndex_v2", path);
    dlclose(h);
    return nullptr;
  }
  if (const Ret r = api->init(); r != 0) {
    if (why)
      *why = fmt::format("{}: nvmlInit_v2 failed: {}", path,
                         api->error_string ? api->error_string(r) : fmt::format("error {}", r));
    dlclose(h);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(h, path, std::move(api)));
}

std::string Nvml::driver_version() const {
  char buf[96] = {0};
  if (!api_->driver_version || api_->driver_version(buf, sizeof buf) != 0) return "";
  return buf;
}

void* Nvml::device(const std::string& busid, int index, std::string* why) const {
  Dev d = nullptr;
  if (!busid.empty() && api_->by_busid && api_->by_busid(busid.c_str(), &d) == 0) return d;
  if (index >= 0 && api_->by_index && api_->by_index(unsigned(index), &d) == 0) return d;
  if (why)
    *why = busid.empty() ? fmt::format("NVML has no device {}", index)
                         : fmt::format("NVML has no device at PCI bus id {} (nor {})", busid, index);
  return nullptr;
}

std::string Nvml::device_name(void* device) const {
  char buf[96] = {0};
  if (!api_->name || api_->name(device, buf, sizeof buf) != 0) return "";
  return buf;
}

GpuReading Nvml::read(void* device) const {
  GpuReading g;
  Utilization u{};
  if (api_->utilization && api_->utilization(device, &u) == 0) {
    g.util_pct = u.gpu;
    g.mem_util_pct = u.memory;
  }
  Memory m{};
  if (api_->memory && api_->memory(device, &m) == 0) {
    g.mem_used_bytes = double(m.used);
    g.mem_total_bytes = double(m.total);
  }
  unsigned v = 0;
  if (api_->temperature && api_->temperature(device, kTemperatureGpu, &v) == 0) g.temp_c = v;
  if (api_->power && api_->power(device, &v) == 0) g.power_w = v / 1000.0;  // milliwatts
  if (api_->power_limit && api_->power_limit(device, &v) == 0) g.power_limit_w = v / 1000.0;
  if (api_->clock && api_->clock(device, kClockSm, &v) == 0) g.sm_clock_mhz = v;
  unsigned long long r = 0;
  if (api_->reasons && api_->reasons(device, &r) == 0) g.reasons = int64_t(r);
  return g;
}

}  // namespace cz::dist
