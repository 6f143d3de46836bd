// cpuid, XCR0 and Linux's AMX permission request behind cpu_features.h.
#include "tensor/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "tensor/check.h"

namespace cz::cpu {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) return {};
  return r;
}

bool bit(unsigned v, int i) {
  return (v >> i) & 1u;
}

unsigned long long xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

std::string brand() {
  if (cpuid(0x80000000u, 0).a < 0x80000004u) return "unknown model";
  char s[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    const Regs r = cpuid(0x80000002u + i, 0);
    std::memcpy(s + 16 * i, &r, 16);
  }
  std::string m(s);
  const auto b = m.find_first_not_of(' '), e = m.find_last_not_of(' ');
  return b == std::string::npos ? "unknown model" : m.substr(b, e - b + 1);
}

// Linux keeps AMX's 8 KiB of tile data out of a thread's state until the process asks for it
// (Documentation/arch/x86/xstate.rst); without the grant the first tile load faults.
bool amx_tile_data_granted() {
#ifdef __linux__
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

bool hidden(const std::string& disable, const char* name) {
  std::stringstream ss(disable);
  for (std::string item; std::getline(ss, item, ',');)
    if (item == name) return true;
  return false;
}

}  // namespace

CpuFeatures detect_cpu_features(const std::string& disable, bool emulate_bf16) {
  CpuFeatures f;
  f.bf16_emulated = emulate_bf16;
  f.model = brand();
  const Regs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.c, 27);
  const unsigned long long x = osxsave ? xcr0() : 0;
  const bool os_avx512 = (x & 0xe6) == 0xe6;               // SSE, AVX, opmask, ZMM halves
  const bool os_amx = (x & (3ull << 17)) == (3ull << 17);  // XTILECFG, XTILEDATA
  const unsigned max_leaf = cpuid(0, 0).a;
  const Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const Regs l7s1 = max_leaf >= 7 && l7.a >= 1 ? cpuid(7, 1) : Regs{};
  const bool avx512f = bit(l7.b, 16), avx512bw = bit(l7.b, 30), avx512vl = bit(l7.b, 31);
  f.avx512_bf16 =
      os_avx512 && avx512f && avx512bw && avx512vl && bit(l7s1.a, 5) && !hidden(disable, "avx512_bf16");
  const bool amx = bit(l7.d, 22) && bit(l7.d, 24);  // AMX-BF16, AMX-TILE
  f.amx_bf16 = os_amx && amx && f.avx512_bf16 && !hidden(disable, "amx_bf16") && amx_tile_data_granted();
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    const char* d = std::getenv("CZ_CPU_DISABLE");
    const char* e = std::getenv("CZ_CPU_BF16_EMULATE");
    return detect_cpu_features(d ? d : "", e && std::string(e) == "1");
  }();
  return f;
}

std::string bf16_isa(const CpuFeatures& f) {
  if (f.bf16_emulated) return "emulated";
  if (f.amx_bf16) return "AMX-BF16";
  return f.avx512_bf16 ? "AVX512_BF16" : "";
}

void require_bf16(const CpuFeatures& f) {
  CZ_CHECK(!bf16_isa(f).empty(),
           "--precision bf16 on the CPU needs AVX512_BF16 or AMX; this CPU ({}) has neither", f.model);
}

}  // namespace cz::cpu
