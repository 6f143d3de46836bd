// Local reductions on the host, used by the ring algorithms and by the MPI backend's f16/bf16 reduction op:
// dst = (a + b) * scale over f32, f64, f16 and bf16 buffers, vectorised (AVX-512/AVX2+F16C when compiled in).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace cz::dist {

// dst[i] = (a[i] + b[i]) * scale for 0 <= i < n. dst may be a or b (the same pointer); no other overlap.
// f16/bf16 inputs are widened to f32, added (and scaled) in f32, and rounded once to nearest-even.
// scale == 1 skips the multiply, so sums are exact wherever the type's addition is.
void reduce_add(DType dtype, void* dst, const void* a, const void* b, int64_t n, double scale = 1.0);

// dst[i] = src[i] * scale (dst may be src). Used for averages after a library sum.
void scale_copy(DType dtype, void* dst, const void* src, int64_t n, double scale);

}  // namespace cz::dist
