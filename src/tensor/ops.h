// All differentiable ops, for convenience.
#pragma once

#include "tensor/ops/elementwise.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/reduce.h"
