// Activation checkpointing: run a segment without keeping its intermediate activations, recompute them during
// backward. Gradients are identical to running the segment plainly (the recompute replays the same ops on the
// same values, and the same random numbers when a generator is given).
#pragma once

#include <functional>
#include <vector>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace cz {

using SegmentFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// `params`: the leaves the segment uses besides `inputs` (a module's parameters). Their gradients leave the
// checkpoint through the outer graph, so they accumulate and fire grad-ready hooks exactly as without it.
// `rng`: a generator the segment draws from (drop-path); its state is replayed for the recompute.
std::vector<Tensor> checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& params, Generator* rng = nullptr);

}  // namespace cz
