// Small enums shared by the CPU and CUDA kernel interfaces.
#pragma once

namespace cz {

enum class BinaryOp { add, mul };  // add: a + alpha * b; mul: a * b

}  // namespace cz
