// One element of a floating-point buffer read or written as a double, whatever its dtype: for checks that
// work out in double what a kernel or a collective should give and compare (commbench's #wrong, the
// collectives' tests).
#pragma once

#include <cstdint>

#include "tensor/check.h"
#include "tensor/dtype.h"

namespace cz {

// Element i of `p` (dtype t: f32, f64, f16 or bf16) as a double; DtypeError for another dtype.
inline double load_element(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f64:
      return static_cast<const double*>(p)[i];
    case DType::f16:
      return float(static_cast<const Half*>(p)[i]);
    case DType::bf16:
      return float(static_cast<const BFloat16*>(p)[i]);
    default:
      throw DtypeError(fmt::format("load_element: {} is not a floating-point dtype", dtype_name(t)));
  }
}

// `v` rounded to t (f16 and bf16 by way of f32) into element i of `p`; DtypeError for another dtype.
inline void store_element(DType t, void* p, int64_t i, double v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = float(v);
      return;
    case DType::f64:
      static_cast<double*>(p)[i] = v;
      return;
    case DType::f16:
      static_cast<Half*>(p)[i] = Half(float(v));
      return;
    case DType::bf16:
      static_cast<BFloat16*>(p)[i] = BFloat16(float(v));
      return;
    default:
      throw DtypeError(fmt::format("store_element: {} is not a floating-point dtype", dtype_name(t)));
  }
}

}  // namespace cz
