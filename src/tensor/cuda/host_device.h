// CZ_HD: a function nvcc compiles for both host and device (inlined), and a plain inline function for a C++
// compiler, so that per-thread arithmetic headers (soft_target_rows.h, model_input_element.h) can be tested
// on the CPU without CUDA's headers.
#pragma once

#if defined(__CUDACC__)
#define CZ_HD __host__ __device__ __forceinline__
#else
#define CZ_HD inline
#endif
