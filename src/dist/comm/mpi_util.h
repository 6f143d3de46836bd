// MPI helpers: the StatusTraits that let CZ_MPI(...) report MPI failures as CommError with the statement,
// file:line and rank, and the MPI datatypes/ops for our dtypes (f16/bf16 get their own types and a summing op
// that accumulates in f32, since MPI has none).
#pragma once

#include <mpi.h>

#include <string>

#include "tensor/check.h"
#include "tensor/dtype.h"

namespace cz::dist {

// A distinct type for MPI's int return codes, so their StatusTraits cannot clash with another library's ints.
struct MpiStatus {
  int code;
};

// MPI datatype for a dtype (f16/bf16: our own 2-byte types, which only our sum op reduces).
MPI_Datatype mpi_datatype(DType dtype);
// MPI_SUM for f32/f64; our commutative f32-accumulating sum for f16/bf16.
MPI_Op mpi_sum_op(DType dtype);

}  // namespace cz::dist

template <>
struct cz::StatusTraits<cz::dist::MpiStatus> {
  using error_type = CommError;
  static constexpr const char* library = "MPI";
  static bool ok(cz::dist::MpiStatus s) { return s.code == MPI_SUCCESS; }
  static std::string describe(cz::dist::MpiStatus s) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(s.code, buf, &len) != MPI_SUCCESS) return "code " + std::to_string(s.code);
    return std::string(buf, size_t(len));
  }
};

#define CZ_MPI(expr) CZ_CHECK_STATUS(::cz::dist::MpiStatus{(expr)})
