// StatusTraits for the CUDA runtime, cuBLAS/cuBLASLt and cuDNN, so CZ_CHECK_STATUS(cudaMalloc(...)) throws an
// Error naming the library, the code, the statement, file:line and the rank. Host code only: .cu files cannot
// include fmt (see launch.h); their launchers return the launch's cudaError_t for the caller to check.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

#include "tensor/check.h"

namespace cz {

template <>
struct StatusTraits<cudaError_t> {
  static constexpr const char* library = "CUDA";
  static bool ok(cudaError_t e) { return e == cudaSuccess; }
  static std::string describe(cudaError_t e) {
    return fmt::format("{} ({}: {})", cudaGetErrorName(e), int(e), cudaGetErrorString(e));
  }
};

template <>
struct StatusTraits<cublasStatus_t> {
  static constexpr const char* library = "cuBLAS";
  static bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
  static std::string describe(cublasStatus_t s) {
    return fmt::format("{} ({}: {})", cublasGetStatusName(s), int(s), cublasGetStatusString(s));
  }
};

template <>
struct StatusTraits<cudnnStatus_t> {
  static constexpr const char* library = "cuDNN";
  static bool ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
  static std::string describe(cudnnStatus_t s) {
    char detail[512] = {};
    cudnnGetLastErrorString(detail, sizeof(detail));
    return fmt::format("{} ({}){}{}", cudnnGetErrorString(s), int(s), detail[0] ? ": " : "", detail);
  }
};

}  // namespace cz
