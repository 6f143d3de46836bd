// Flattening parameters into one buffer and re-pointing them at it.
#include "tensor/flat.h"

#include "tensor/autograd/engine.h"

namespace cz {

const FlatSegment& FlatLayout::find(const std::string& name) const {
  for (const FlatSegment& s : segments)
    if (s.name == name) return s;
  throw ValueError(fmt::format("flat buffer has no parameter named '{}'", name));
}

void repoint_parameter(const Tensor& t, const Tensor& buffer, int64_t offset) {
  TensorImpl* impl = t.impl();
  impl->storage = buffer.storage();
  impl->dtype = buffer.dtype();
  impl->offset = buffer.offset() + offset;
  impl->strides = contiguous_strides(impl->sizes);
}

FlatParams flatten_parameters(const std::vector<std::pair<std::string, Tensor>>& params, int64_t align) {
  CZ_CHECK(!params.empty(), "flatten_parameters: no parameters");
  CZ_CHECK(align >= 1, "flatten_parameters: align must be >= 1, got {}", align);
  FlatLayout layout;
  layout.align = align;
  int64_t offset = 0;
  for (const auto& [name, p] : params) {
    layout.segments.push_back({name, offset, p.numel(), p.sizes()});
    offset += (p.numel() + align - 1) / align * align;
  }
  layout.numel = offset;
  return flatten_parameters(params, layout);
}

FlatParams flatten_parameters(const std::vector<std::pair<std::string, Tensor>>& params,
                              const FlatLayout& layout) {
  CZ_CHECK(!params.empty(), "flatten_parameters: no parameters");
  CZ_CHECK(params.size() == layout.segments.size(), "flatten_parameters: {} parameters for a layout of {}",
           params.size(), layout.segments.size());
  const Tensor& first = params.front().second;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    CZ_CHECK(p.is_leaf(), "flatten_parameters: '{}' is not a leaf tensor", name);
    CZ_CHECK_DTYPE(p.dtype() == first.dtype(), "flatten_parameters: '{}' is {} but '{}' is {}", name,
                   dtype_name(p.dtype()), params.front().first, dtype_name(first.dtype()));
    CZ_CHECK_DEVICE(p.device() == first.device(), "flatten_parameters: '{}' is on {} but '{}' is on {}", name,
                    p.device().str(), params.front().first, first.device().str());
    const FlatSegment& s = layout.segments[i];
    CZ_CHECK_SHAPE(s.name == name && s.shape == p.sizes() && s.offset + s.numel <= layout.numel,
                   "flatten_parameters: '{}' of shape {} does not match the layout's '{}' of shape {}", name,
                   shape_str(p.sizes()), s.name, shape_str(s.shape));
  }
  FlatParams flat;
  flat.layout = layout;
  flat.params = zeros({layout.numel}, first.dtype(), first.device());
  flat.grads = zeros({layout.numel}, first.dtype(), first.device());
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const FlatSegment& s = layout.segments[i];
    const Tensor& p = params[i].second;
    flat.params.narrow(0, s.offset, s.numel).view(s.shape).copy_(p);
    repoint_parameter(p, flat.params, s.offset);
    Tensor(p).set_grad(view_of_storage(flat.grads, s.shape, flat.grads.offset() + s.offset));
  }
  return flat;
}

void bind_parameters(const std::vector<std::pair<std::string, Tensor>>& params, const FlatLayout& layout,
                     const Tensor& buffer) {
  CZ_CHECK(params.size() == layout.segments.size(), "bind_parameters: {} parameters for a layout of {}",
           params.size(), layout.segments.size());
  CZ_CHECK_SHAPE(buffer.dim() == 1 && buffer.numel() == layout.numel && buffer.is_contiguous(),
                 "bind_parameters: buffer has shape {}, layout needs ({})", shape_str(buffer.sizes()),
                 layout.numel);
  for (size_t i = 0; i < params.size(); ++i) {
    const FlatSegment& s = layout.segments[i];
    CZ_CHECK_SHAPE(params[i].second.sizes() == s.shape, "bind_parameters: '{}' has shape {}, layout says {}",
                   params[i].first, shape_str(params[i].second.sizes()), shape_str(s.shape));
    Tensor p = params[i].second;
    repoint_parameter(p, buffer, s.offset);
    // A .grad of the old dtype or device cannot be accumulated into any more (the next backward would fail
    // in add_): drop it; the caller binds a new one (the trainer's bf16 gradient buffer, say).
    const Tensor g = p.grad();
    if (g.defined() && (g.dtype() != p.dtype() || g.device() != p.device())) p.set_grad(Tensor());
  }
}

}  // namespace cz
