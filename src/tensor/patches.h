// Note [Patchify as a GEMM]: a convolution whose kernel equals its stride (ConvNeXt's 4x4 stem, its 2x2
// downsamplings) has non-overlapping windows, so it is one GEMM over the patches:
//   y (N Ho Wo, Cout) = patches (N Ho Wo, k k C) . w (Cout, k k C)^T + bias,
// with the (Cout, k, k, C) weight read as (Cout, k k C) and each patch laid out (kh, kw, c) to match. The
// patches are a strided view of x; the rows and columns the floor of H / k, W / k drops are not in it, which
// is also where backward's dx is zero. The CUDA backend runs this when cuDNN has no algorithm for a shape.
#pragma once

#include "tensor/tensor.h"

namespace cz {

// x: (N, H, W, C) contiguous -> a view (N, H / k, W / k, k, k, C) of its patches (not contiguous).
inline Tensor patches_view(const Tensor& x, int64_t k) {
  const int64_t N = x.size(0), Ho = x.size(1) / k, Wo = x.size(2) / k, C = x.size(3);
  return x.narrow(1, 0, Ho * k).narrow(2, 0, Wo * k).view({N, Ho, k, Wo, k, C}).permute({0, 1, 3, 2, 4, 5});
}

}  // namespace cz
