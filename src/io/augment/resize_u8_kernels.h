// The inner loop of the 8-bit resize (Note [8-bit resize], image_transform.h), compiled once per instruction
// set and chosen when the program starts (Note [Resize kernels per instruction set]).
//
// Note [Resize kernels per instruction set]: resize_u8_kernel.inc is one plain C++ loop nest, compiled three
// times: for the x86-64 baseline (SSE2), for x86-64-v3 (AVX2) and for x86-64-v4 (AVX-512 F/BW/DQ/VL), each in
// a file of its own with its -march (src/io/CMakeLists.txt), so the compiler vectorises the same source 4, 8
// and 16 integers wide and no source line is written per instruction set. resize_u8_kernel_for() picks the
// widest one the CPU has (`__builtin_cpu_supports`), or the one CZ_RESIZE_KERNEL names (scalar | baseline |
// avx2 | avx512) for tests and measurements. The sums are integers, exact in any order, so every kernel
// gives the scalar loops' (PIL's) bytes exactly: tests/io/test_resize_u8.cpp compares them on every kernel
// the CPU can run. The files use no inline library functions (std::clamp, std::vector): an inline function
// compiled in an AVX-512 file could be the copy the linker keeps for all of them, and would then run on a CPU
// without AVX-512.
#pragma once

#include <cstdint>
#include <string>

namespace cz {

// One axis's taps in PIL's fixed point: output i reads `count[i]` inputs from `first[i]`, with weights
// coeff[i * stride .. i * stride + count[i]).
struct AxisTapsView {
  const int64_t* first = nullptr;
  const int32_t* count = nullptr;
  const int32_t* coeff = nullptr;
  int64_t stride = 0;  // coefficients per output (the widest output's count)
  int64_t outputs = 0;
};

// Resamples along the rows: output row o (`out + o * out_stride`) is the weighted sum of rows first[o]...
// of `in` (`in_stride` bytes apart), `n` bytes each, rounded to 8 bits; with `mirror_pixels`, each output row
// is written right to left in 3-byte pixels (the flip, fused into the pass). `acc`: n int32 of scratch.
using RowsPassFn = void (*)(const uint8_t* in, int64_t in_stride, int64_t n, const AxisTapsView& taps,
                            uint8_t* out, int64_t out_stride, bool mirror_pixels, int32_t* acc);

enum class ResizeKernel { scalar, baseline, avx2, avx512 };

const char* resize_kernel_name(ResizeKernel kernel);
bool resize_kernel_runs_here(ResizeKernel kernel);  // compiled in and supported by this CPU
// The kernel resample_u8 uses: CZ_RESIZE_KERNEL when set (an unknown name or one this CPU cannot run is an
// error naming the variable), else the widest this CPU runs.
ResizeKernel default_resize_kernel();
// nullptr for ResizeKernel::scalar (resize_u8.cpp's own per-pixel loops).
RowsPassFn rows_pass_for(ResizeKernel kernel);

namespace resize_kernels {
void rows_pass_baseline(const uint8_t*, int64_t, int64_t, const AxisTapsView&, uint8_t*, int64_t, bool,
                        int32_t*);
void rows_pass_avx2(const uint8_t*, int64_t, int64_t, const AxisTapsView&, uint8_t*, int64_t, bool, int32_t*);
void rows_pass_avx512(const uint8_t*, int64_t, int64_t, const AxisTapsView&, uint8_t*, int64_t, bool,
                      int32_t*);
}  // namespace resize_kernels

}  // namespace cz
