// Device reductions for the ring over NCCL point-to-point: dst = (a + b) * scale on a CUDA stream, one
// launcher per dtype (16-bit types add in f32 and round once, like the host kernels). dst may be a or b. The
// .cu side includes no project headers, so it compiles whatever C++ standard nvcc is given (CMake 3.25 knows
// no CUDA20 dialect, and fmt does not compile under nvcc's C++20 mode).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cz::dist::cuda {

cudaError_t reduce_add_f32(void* dst, const void* a, const void* b, int64_t n, double scale, cudaStream_t s);
cudaError_t reduce_add_f64(void* dst, const void* a, const void* b, int64_t n, double scale, cudaStream_t s);
cudaError_t reduce_add_f16(void* dst, const void* a, const void* b, int64_t n, double scale, cudaStream_t s);
cudaError_t reduce_add_bf16(void* dst, const void* a, const void* b, int64_t n, double scale, cudaStream_t s);

}  // namespace cz::dist::cuda
