// The CPU features that decide whether --precision bf16 can run on the CPU: AVX512_BF16 and AMX-BF16 (cpuid,
// with the OS's consent through XCR0 and, for AMX tile data, Linux's arch_prctl permission).
#pragma once

#include <string>

namespace cz::cpu {

struct CpuFeatures {
  std::string model;         // the cpuid brand string, as lscpu's "Model name"
  bool avx512_bf16 = false;  // VCVTNE2PS2BF16 / VDPBF16PS, with the OS saving the AVX-512 state
  bool amx_bf16 = false;     // AMX-BF16 and AMX-TILE, with this process granted the tile data (Linux)
  // CZ_CPU_BF16_EMULATE=1: bf16 GEMMs as f32 GEMMs of bf16-rounded operands (the same products, summed in the
  // f32 library's order), on any CPU; for tests of the bf16 path where the CPU has neither feature.
  bool bf16_emulated = false;
};

// This CPU's features, detected once. CZ_CPU_DISABLE=avx512_bf16,amx_bf16 (a comma list; either name) hides
// features, as oneDNN's ONEDNN_MAX_CPU_ISA does: to see the refusal, or the AVX512_BF16 path on an AMX CPU.
const CpuFeatures& cpu_features();
// The detection itself, with the hidden features given (the environment's list above): for tests.
CpuFeatures detect_cpu_features(const std::string& disable, bool emulate_bf16 = false);

// What bf16 GEMMs run on with these features: "emulated", "AMX-BF16", "AVX512_BF16", or "" for none.
std::string bf16_isa(const CpuFeatures& f);
// Throws "--precision bf16 on the CPU needs AVX512_BF16 or AMX; this CPU (<model>) has neither" where f has
// neither.
void require_bf16(const CpuFeatures& f);

}  // namespace cz::cpu
