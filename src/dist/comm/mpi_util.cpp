// MPI datatypes and the f16/bf16 summing op.
#include "dist/comm/mpi_util.h"

#include <mutex>

#include "dist/comm/reduce_kernels.h"

namespace cz::dist {
namespace {

struct HalfTypes {
  MPI_Datatype f16 = MPI_DATATYPE_NULL;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL;
};

HalfTypes& half_types();

// MPI_User_function: inout[i] = in[i] + inout[i].
void sum16(void* in, void* inout, int* len, MPI_Datatype* type) {
  const DType dt = *type == half_types().f16 ? DType::f16 : DType::bf16;
  reduce_add(dt, inout, in, inout, *len);
}

HalfTypes& half_types() {
  static HalfTypes types;
  static std::once_flag once;
  std::call_once(once, [] {
    CZ_MPI(MPI_Type_contiguous(2, MPI_BYTE, &types.f16));
    CZ_MPI(MPI_Type_commit(&types.f16));
    CZ_MPI(MPI_Type_contiguous(2, MPI_BYTE, &types.bf16));
    CZ_MPI(MPI_Type_commit(&types.bf16));
    CZ_MPI(MPI_Op_create(&sum16, /*commute=*/1, &types.sum));
  });
  return types;
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f16:
      return half_types().f16;
    case DType::bf16:
      return half_types().bf16;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
    case DType::b8:
      return MPI_BYTE;
  }
  throw DtypeError(fmt::format("no MPI datatype for {}", dtype_name(dtype)));
}

MPI_Op mpi_sum_op(DType dtype) {
  return (dtype == DType::f16 || dtype == DType::bf16) ? half_types().sum : MPI_SUM;
}

}  // namespace cz::dist
