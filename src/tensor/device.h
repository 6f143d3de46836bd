// Where a tensor's bytes live.
#pragma once

#include <cstdint>
#include <string>

namespace cz {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

Device parse_device(const std::string& s);  // "cpu", "cuda", "cuda:1"; throws ValueError otherwise

// True when this build has the CUDA backend and a GPU is visible.
bool cuda_available();
int cuda_device_count();

}  // namespace cz
