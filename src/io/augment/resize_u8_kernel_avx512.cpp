// The rows pass compiled for the avx512 instruction set (Note [Resize kernels per instruction set],
// resize_u8_kernels.h; its -march: src/io/CMakeLists.txt).
#include "io/augment/resize_u8_kernels.h"

#define CZ_ROWS_PASS_NAME rows_pass_avx512
#include "io/augment/resize_u8_kernel.inc"
