// Backend dispatch for ops: CPU kernels always exist; CUDA kernels only in builds with the CUDA backend.
// Tensors cannot live on a GPU in a CPU-only build (its allocator refuses), so the fallback is unreachable in
// practice and throws a DeviceError if it ever is reached.
#pragma once

#include "tensor/check.h"

#if CZ_WITH_CUDA
#include "tensor/cuda/kernels.h"
#define CZ_CUDA_CALL(...) __VA_ARGS__
#else
#define CZ_CUDA_CALL(...) throw ::cz::DeviceError(fmt::format("{}: this build has no CUDA backend", __func__))
#endif
