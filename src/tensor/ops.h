// All differentiable ops, for convenience.
#pragma once

#include "tensor/ops/activation.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/drop_path.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/grn.h"
#include "tensor/ops/layer_norm.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/linear_fused.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/pool.h"
#include "tensor/ops/reduce.h"
