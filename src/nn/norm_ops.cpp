// The normalization layers' ops for a model's walk (norm_ops.h): buffers and work as the kernels have them.
#include "nn/norm_ops.h"

namespace cz::nn {

// layer_norm: its output, then f32 mean and rstd per row (the accumulation type, so that backward does not
// renormalise with rounded values), which the node keeps beside its input. Forward reads x and writes y,
// 8 FLOPs an element, and writes the two statistics; backward reads the gradient and x, writes dx, 12 FLOPs
// an element, and reads the statistics.
NormOp layer_norm_op(int64_t rows, int64_t c) {
  const double r = double(rows), rc = r * double(c);
  return {.name = "layer_norm",
          .backward_name = "LayerNormBackward",
          .rows = rows,
          .c = c,
          .saved = {{rows * 4, "layer_norm mean"}, {rows * 4, "layer_norm rstd"}},
          .output = "layer_norm output",
          .input_grad = "layer_norm input gradient",
          .weight_grad = "layer_norm weight gradient",
          .bias_grad = "layer_norm bias gradient",
          .forward = {8 * rc, 2 * rc, 8 * r},
          .backward = {12 * rc, 3 * rc, 8 * r}};
}

// grn: its output, then per image the channels' f32 norms and the f32 divisor, which the node keeps beside
// its input; the CPU kernels' partial sums are not the allocator's. Forward: the norms' pass reads the input,
// the output pass reads and writes; backward reads the gradient and the input twice (the sums, then dx) and
// writes dx.
NormOp grn_op(int64_t images, int64_t rows, int64_t c) {
  const double rc = double(rows * c);
  return {.name = "grn",
          .backward_name = "GrnBackward",
          .rows = rows,
          .c = c,
          .saved = {{images * c * 4, "grn norms (f32)"}, {images * 4, "grn divisors (f32)"}},
          .output = "grn output",
          .input_grad = "grn input gradient",
          .weight_grad = "grn weight gradient",
          .bias_grad = "grn bias gradient",
          .forward = {6 * rc, 3 * rc, 0},
          .backward = {12 * rc, 4 * rc, 0}};
}

}  // namespace cz::nn
