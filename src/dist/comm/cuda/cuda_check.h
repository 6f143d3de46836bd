// StatusTraits for the CUDA runtime and NCCL as the communication layer uses them (failures are CommErrors).
// CUDA codes are wrapped in a distinct type so these traits cannot collide with the tensor layer's own.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "tensor/check.h"

namespace cz::dist {
struct CudaStatus {
  cudaError_t code;
};
}  // namespace cz::dist

template <>
struct cz::StatusTraits<cz::dist::CudaStatus> {
  using error_type = CommError;
  static constexpr const char* library = "CUDA";
  static bool ok(cz::dist::CudaStatus s) { return s.code == cudaSuccess; }
  static std::string describe(cz::dist::CudaStatus s) {
    return std::string(cudaGetErrorName(s.code)) + " (" + cudaGetErrorString(s.code) + ")";
  }
};

template <>
struct cz::StatusTraits<ncclResult_t> {
  using error_type = CommError;
  static constexpr const char* library = "NCCL";
  static bool ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }
  static std::string describe(ncclResult_t r) {
    std::string s = ncclGetErrorString(r);
    const char* last = ncclGetLastError(nullptr);
    if (last && *last) s += std::string(": ") + last;
    return s;
  }
};

#define CZ_CUDA_COMM(expr) CZ_CHECK_STATUS(::cz::dist::CudaStatus{(expr)})
#define CZ_NCCL(expr) CZ_CHECK_STATUS((expr))
