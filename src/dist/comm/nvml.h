// NVML, the driver's management library, loaded at run time (dlopen) so that CPU builds and machines without
// a driver build and run unchanged: what a GPU reports about its health (utilization, memory, temperature,
// power, SM clock, why its clocks are held down) and the driver's version.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace cz::dist {

// Note [NVML at run time]: the library is libnvidia-ml.so.1 (the driver installs it; the CUDA toolkit ships
// only its header), or the file $CZ_NVML_LIBRARY names: the tests point that at a stand-in that plays NVML's
// C interface with values they control. Only the functions and structs below are used, declared here by
// their documented ABI (nvml.h is not needed to build): nvmlInit_v2, nvmlShutdown, nvmlErrorString,
// nvmlSystemGetDriverVersion, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetHandleByPciBusId_v2,
// nvmlDeviceGetName, nvmlDeviceGetUtilizationRates, nvmlDeviceGetMemoryInfo, nvmlDeviceGetTemperature,
// nvmlDeviceGetPowerUsage, nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetClockInfo, and
// nvmlDeviceGetCurrentClocksEventReasons (drivers before 535: ...ClocksThrottleReasons, the same bits). A
// reading a device does not support (a fan-less board's power, an old driver's reasons) is left unknown,
// not zero.

// The clocks event ("throttle") reasons' bits, as nvml.h defines them.
namespace nvml_reason {
inline constexpr uint64_t kGpuIdle = 0x1;
inline constexpr uint64_t kApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kSwPowerCap = 0x4;
inline constexpr uint64_t kHwSlowdown = 0x8;
inline constexpr uint64_t kSyncBoost = 0x10;
inline constexpr uint64_t kSwThermalSlowdown = 0x20;
inline constexpr uint64_t kHwThermalSlowdown = 0x40;
inline constexpr uint64_t kHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kDisplayClockSetting = 0x100;
// The reasons that slow a busy GPU down against its will: power cap, thermal, hardware slowdown.
inline constexpr uint64_t kThrottling =
    kSwPowerCap | kHwSlowdown | kSwThermalSlowdown | kHwThermalSlowdown | kHwPowerBrakeSlowdown;
}  // namespace nvml_reason

// "sw_power_cap,hw_thermal_slowdown"; "none" for 0.
std::string nvml_reason_names(uint64_t reasons);

// One reading of one GPU. Negative: the device did not say.
struct GpuReading {
  double util_pct = -1;      // of the last sample period, the time a kernel ran
  double mem_util_pct = -1;  // of it, the time device memory was read or written
  double mem_used_bytes = -1, mem_total_bytes = -1;
  double temp_c = -1;
  double power_w = -1, power_limit_w = -1;  // draw and the enforced cap
  double sm_clock_mhz = -1;
  int64_t reasons = -1;  // nvml_reason bits
};

class Nvml {
 public:
  // The library and nvmlInit_v2, or nullptr with `why` saying what failed (not found, no driver, ...).
  static std::unique_ptr<Nvml> open(std::string* why);
  ~Nvml();  // nvmlShutdown, dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  const std::string& path() const { return path_; }  // what was loaded
  std::string driver_version() const;                // "550.54.15"; "" when unknown
  // The device at a PCI bus id ("0000:1b:00.0"), else at NVML's `index`; nullptr with `why` when neither.
  void* device(const std::string& busid, int index, std::string* why) const;
  std::string device_name(void* device) const;
  GpuReading read(void* device) const;

 private:
  struct Api;
  Nvml(void* handle, std::string path, std::unique_ptr<Api> api);
  void* handle_;
  std::string path_;
  std::unique_ptr<Api> api_;
};

}  // namespace cz::dist
