// Flat parameter and gradient buffers. Note [Flat buffers]: a model's parameters are moved into one
// contiguous buffer and its gradients into another, each parameter a view at a fixed offset (aligned for
// SIMD). Optimizers then run over one buffer instead of hundreds of tensors, and ZeRO partitions are plain
// ranges of it: a shard is [begin, end) of the flat space, and a parameter may straddle shard boundaries.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace cz {

struct FlatSegment {
  std::string name;
  int64_t offset = 0;  // elements from the start of the flat buffer
  int64_t numel = 0;
  Shape shape;
};

struct FlatLayout {
  std::vector<FlatSegment> segments;  // in buffer order
  int64_t numel = 0;                  // including alignment padding
  int64_t align = 1;

  const FlatSegment& find(const std::string& name) const;  // throws ValueError naming the missing parameter
};

struct FlatParams {
  Tensor params;  // (numel) in the parameters' dtype and device; padding is zero
  Tensor grads;   // same size; each parameter's .grad is a view into it
  FlatLayout layout;
};

// Moves `params` (leaves of one dtype and device) into a new flat buffer, keeping their values; the Tensor
// handles the caller (and modules) hold stay valid and now view the buffer. Each parameter's .grad becomes a
// view into a zeroed flat gradient buffer. `align`: segment offsets are multiples of this many elements.
FlatParams flatten_parameters(const std::vector<std::pair<std::string, Tensor>>& params, int64_t align = 16);
// The same into a given layout (segments in the order of `params`, with their names and shapes; gaps between
// segments are padding), e.g. ZeRO's, whose partitions are padded (Note [ZeRO partitioning]).
FlatParams flatten_parameters(const std::vector<std::pair<std::string, Tensor>>& params,
                              const FlatLayout& layout);

// Points each parameter of `layout` (matched by position in `params`) at `buffer`, which must have
// layout.numel elements. Used when the storage behind a flat buffer changes (ZeRO-3 gathers, device moves,
// a 16-bit compute copy). The parameters take the buffer's dtype and device; a .grad that no longer matches
// them is dropped (bind a new one with set_grad).
void bind_parameters(const std::vector<std::pair<std::string, Tensor>>& params, const FlatLayout& layout,
                     const Tensor& buffer);

// Re-points one parameter (keeping its TensorImpl, so every handle sees it) at `buffer` from element
// `offset`, taking the buffer's dtype and device; contiguous strides.
void repoint_parameter(const Tensor& param, const Tensor& buffer, int64_t offset);

}  // namespace cz
