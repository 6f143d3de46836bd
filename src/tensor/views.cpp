// View ops (view, reshape, permute, narrow, ...) and device/dtype copies, with their backward rules.
#include <algorithm>
#include <numeric>

#include "tensor/autograd/engine.h"
#include "tensor/autograd/node.h"
#include "tensor/tensor.h"

namespace cz {

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

namespace {

// A view of `base` with new geometry over the same storage.
Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

class ReshapeBackward final : public Node {
 public:
  explicit ReshapeBackward(Shape input_sizes) : input_sizes_(std::move(input_sizes)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0].reshape(input_sizes_)}; }
  std::string name() const override { return "ReshapeBackward"; }

 private:
  Shape input_sizes_;
};

class PermuteBackward final : public Node {
 public:
  explicit PermuteBackward(std::vector<int64_t> dims) : inverse_(dims.size()) {
    for (size_t i = 0; i < dims.size(); ++i) inverse_[size_t(dims[i])] = int64_t(i);
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0].permute(inverse_)}; }
  std::string name() const override { return "PermuteBackward"; }

 private:
  std::vector<int64_t> inverse_;
};

class NarrowBackward final : public Node {
 public:
  NarrowBackward(Shape input_sizes, int64_t dim, int64_t start)
      : input_sizes_(std::move(input_sizes)), dim_(dim), start_(start) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor gi = zeros(input_sizes_, g[0].dtype(), g[0].device());
    Tensor slot = gi.narrow(dim_, start_, g[0].size(dim_));
    slot.copy_(g[0]);
    return {gi};
  }
  std::string name() const override { return "NarrowBackward"; }

 private:
  Shape input_sizes_;
  int64_t dim_, start_;
};

class IdentityBackward final : public Node {  // clone, contiguous
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {std::move(g[0])}; }
  std::string name() const override { return "CloneBackward"; }
};

class ToBackward final : public Node {  // dtype or device change: send the gradient back in the input's kind
 public:
  ToBackward(DType dtype, Device device) : dtype_(dtype), device_(device) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0].to(device_).to(dtype_)}; }
  std::string name() const override { return "ToBackward"; }

 private:
  DType dtype_;
  Device device_;
};

// Strides for viewing `t` as `shape` without copying, if the existing strides allow it. The old dims (size-1
// dims dropped) fall into chunks that are contiguous among themselves; each new dim must lie inside one
// chunk.
bool view_strides(const Tensor& t, const Shape& shape, Shape& out) {
  out.assign(shape.size(), 1);
  if (t.numel() == 0) {
    out = contiguous_strides(shape);
    return true;
  }
  struct Chunk {
    int64_t numel, stride;  // elements in the chunk, stride of its innermost dim
  };
  std::vector<Chunk> chunks;  // innermost first
  for (size_t i = t.sizes().size(); i-- > 0;) {
    const int64_t n = t.sizes()[i], st = t.strides()[i];
    if (n == 1) continue;
    if (!chunks.empty() && st == chunks.back().stride * chunks.back().numel)
      chunks.back().numel *= n;
    else
      chunks.push_back({n, st});
  }
  size_t ci = 0;
  int64_t consumed = 1;  // product of new dims placed in chunk ci so far
  for (size_t j = shape.size(); j-- > 0;) {
    if (shape[j] == 1) {
      out[j] = ci < chunks.size() ? chunks[ci].stride * consumed : 1;
      continue;
    }
    if (ci >= chunks.size()) return false;
    out[j] = chunks[ci].stride * consumed;
    consumed *= shape[j];
    if (consumed == chunks[ci].numel) {
      ++ci;
      consumed = 1;
    } else if (consumed > chunks[ci].numel) {
      return false;
    }
  }
  return ci == chunks.size();
}

Shape infer_shape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      CZ_CHECK_SHAPE(infer < 0, "{}: only one dimension can be -1 in {}", op, shape_str(shape));
      infer = int64_t(i);
    } else {
      CZ_CHECK_SHAPE(out[i] >= 0, "{}: invalid size {} in {}", op, out[i], shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    CZ_CHECK_SHAPE(known > 0 && numel % known == 0, "{}: cannot view {} as {}", op, shape_str(from),
                   shape_str(shape));
    out[size_t(infer)] = numel / known;
  }
  CZ_CHECK_SHAPE(shape_numel(out) == numel, "{}: cannot view {} ({} elements) as {}", op, shape_str(from),
                 numel, shape_str(shape));
  return out;
}

}  // namespace

Tensor Tensor::view(Shape shape) const {
  shape = infer_shape(shape, numel(), "view", sizes());
  Shape strides;
  CZ_CHECK_SHAPE(view_strides(*this, shape, strides),
                 "view: cannot view {} with strides {} as {} without copying; use reshape",
                 shape_str(sizes()), shape_str(this->strides()), shape_str(shape));
  Tensor out = make_view(*this, shape, strides, offset());
  record(std::make_shared<ReshapeBackward>(sizes()), {this}, {&out});
  return out;
}

Tensor Tensor::reshape(Shape shape) const {
  shape = infer_shape(shape, numel(), "reshape", sizes());
  Shape strides;
  if (view_strides(*this, shape, strides)) {
    Tensor out = make_view(*this, shape, strides, offset());
    record(std::make_shared<ReshapeBackward>(sizes()), {this}, {&out});
    return out;
  }
  return clone().view(shape);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  CZ_CHECK_SHAPE(start <= end, "flatten: start dim {} after end dim {}", start, end);
  Shape shape(sizes().begin(), sizes().begin() + start);
  int64_t n = 1;
  for (int64_t d = start; d <= end; ++d) n *= sizes()[size_t(d)];
  shape.push_back(n);
  shape.insert(shape.end(), sizes().begin() + end + 1, sizes().end());
  return reshape(shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims_in) const {
  CZ_CHECK_SHAPE(int64_t(dims_in.size()) == dim(), "permute: {} dims given for a {}-d tensor", dims_in.size(),
                 dim());
  std::vector<int64_t> dims(dims_in.size());
  std::vector<bool> seen(dims_in.size(), false);
  Shape sz(dims.size()), st(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    dims[i] = wrap_dim(dims_in[i], dim(), "permute");
    CZ_CHECK_SHAPE(!seen[size_t(dims[i])], "permute: dimension {} repeated in ({})", dims[i],
                   fmt::join(dims_in, ", "));
    seen[size_t(dims[i])] = true;
    sz[i] = sizes()[size_t(dims[i])];
    st[i] = strides()[size_t(dims[i])];
  }
  Tensor out = make_view(*this, sz, st, offset());
  record(std::make_shared<PermuteBackward>(dims), {this}, {&out});
  return out;
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  std::vector<int64_t> dims(static_cast<size_t>(dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[size_t(wrap_dim(a, dim(), "transpose"))], dims[size_t(wrap_dim(b, dim(), "transpose"))]);
  return permute(dims);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  const int64_t n = sizes()[size_t(d)];
  CZ_CHECK_SHAPE(start >= 0 && length >= 0 && start + length <= n,
                 "narrow: [{}, {}) out of range for dimension {} of size {}", start, start + length, d, n);
  Shape sz = sizes();
  sz[size_t(d)] = length;
  Tensor out = make_view(*this, sz, strides(), offset() + start * strides()[size_t(d)]);
  record(std::make_shared<NarrowBackward>(sizes(), d, start), {this}, {&out});
  return out;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  if (index < 0) index += sizes()[size_t(d)];
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape sz = sizes();
  sz.insert(sz.begin() + d, 1);
  return view(sz);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  CZ_CHECK_SHAPE(sizes()[size_t(d)] == 1, "squeeze: dimension {} has size {}, not 1", d, sizes()[size_t(d)]);
  Shape sz = sizes();
  sz.erase(sz.begin() + d);
  return view(sz);
}

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(sizes(), dtype(), device());
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  record(std::make_shared<IdentityBackward>(), {this}, {&out});
  return out;
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor out = empty(sizes(), t, device());
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  if (is_floating(t)) record(std::make_shared<ToBackward>(dtype(), device()), {this}, {&out});
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor out = empty(sizes(), dtype(), d);
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  record(std::make_shared<ToBackward>(dtype(), device()), {this}, {&out});
  return out;
}

}  // namespace cz
