// Tensor: a typed, strided view onto a Storage, with the autograd state needed to record and run backward.
// Strides and offsets count elements. Views (reshape, permute, narrow, ...) share the storage.
// ConvNeXt activations are NHWC (channels-last) everywhere in this project.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/check.h"
#include "tensor/dtype.h"

namespace cz {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "(2, 3, 4)"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

class Node;
class Tensor;
class AccumulateGrad;

// Bytes plus the allocator that owns them. `version` counts in-place writes, so autograd can tell when a
// tensor saved for backward was modified afterwards.
//
// Note [Releasable storage]: ZeRO-3 frees a gathered unit's parameter bytes between uses, while the
// parameters and the views autograd saved of them (SavedTensor keeps t.detach(), which shares this Storage)
// keep pointing here. release() gives the bytes back to the allocator; restore() installs new bytes of the
// same size before the next use. The version is left alone: a re-gathered unit holds the same values, so
// the saved views stay valid. Reading a released storage's data is an error, not a dangling pointer.
class Storage {
 public:
  Storage(DataPtr data, Device device) : data_(std::move(data)), nbytes_(data_.nbytes()), device_(device) {}
  void* data() const {
    CZ_CHECK(data_.get() != nullptr || nbytes_ == 0,
             "storage of {} bytes on {} is released (a ZeRO-3 unit used outside its gather window)", nbytes_,
             device_.str());
    return data_.get();
  }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  Allocator* allocator() const { return data_.owner(); }
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

  bool resident() const { return data_.get() != nullptr || nbytes_ == 0; }
  void release() { data_ = DataPtr(); }
  void restore(DataPtr data) {
    CZ_CHECK(data.nbytes() >= nbytes_, "Storage::restore: {} bytes for a storage of {}", data.nbytes(),
             nbytes_);
    data_ = std::move(data);
  }

 private:
  DataPtr data_;
  size_t nbytes_;
  Device device_;
  uint64_t version_ = 0;
};

// Called with the parameter once its gradient for the current backward pass is final. See Note [Grad hook
// timing].
using GradReadyHook = std::function<void(Tensor& param)>;
// Called with a gradient flowing into a (non-leaf) tensor; may return a replacement (or an undefined tensor
// to keep it).
using GradHook = std::function<Tensor(const Tensor& grad)>;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;                   // null for leaves
  uint32_t output_nr = 0;                          // which output of grad_fn this tensor is
  std::weak_ptr<AccumulateGrad> grad_accumulator;  // leaves only; the graph owns it
  std::shared_ptr<class TensorImpl> grad;          // `.grad`; may be a view into a flat gradient buffer
  bool grad_zero_deferred = false;                 // `.grad` counts as zero (Note [Deferred gradient zero])
  std::vector<std::pair<int, GradReadyHook>> grad_ready_hooks;
  std::vector<GradHook> grad_hooks;
  std::string name;
};

class TensorImpl {
 public:
  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;

  AutogradMeta& meta() {
    if (!autograd) autograd = std::make_unique<AutogradMeta>();
    return *autograd;
  }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const { return impl_->sizes; }
  const Shape& strides() const { return impl_->strides; }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return int64_t(impl_->sizes.size()); }
  int64_t numel() const { return shape_numel(impl_->sizes); }
  int64_t offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  size_t element_size() const { return dtype_size(impl_->dtype); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }
  std::string str() const;  // "f32 (2, 3) cpu"

  void* raw_data() const;
  template <class T>
  T* data() const {
    CZ_CHECK_DTYPE(dtype_of<T> == dtype(), "data<{}>() called on a {} tensor", dtype_name(dtype_of<T>),
                   dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }

  // Views (differentiable; share storage).
  Tensor view(Shape shape) const;     // needs compatible strides; -1 infers one dimension
  Tensor reshape(Shape shape) const;  // a view when possible, else a copy
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // drops `dim`
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor contiguous() const;  // itself when already contiguous

  // Copies.
  Tensor clone() const;
  Tensor to(DType dtype) const;  // itself when already of that dtype
  Tensor to(Device device) const;
  Tensor cpu() const { return to(Device::cpu()); }

  // In-place (not recorded by autograd; refused on tensors that need grad while grad mode is on).
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // any strides, converts dtype, crosses devices
  // copy_ where the destination is not read again soon (a gradient copied into a flat buffer): on the CPU a
  // large copy of one dtype bypasses the cache (Note [Streaming gradient copies]); elsewhere copy_.
  Tensor& copy_streaming_(const Tensor& src);
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double factor);

  // Host reads.
  double item() const;  // one element
  template <class T>
  std::vector<T> to_vector() const;  // contiguous copy converted to T

  // Autograd.
  bool requires_grad() const { return impl_->autograd && impl_->autograd->requires_grad; }
  Tensor& set_requires_grad(bool value);
  bool is_leaf() const { return !impl_->autograd || !impl_->autograd->grad_fn; }
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const { return impl_->autograd ? impl_->autograd->output_nr : 0; }
  Tensor grad() const;                // zeroes a .grad left by defer_grad_zero() first
  void set_grad(const Tensor& grad);  // e.g. a view into a flat buffer; later backwards accumulate into it
  // Zero .grad without writing it (Note [Deferred gradient zero]): the next gradient accumulated into it
  // overwrites it, and a grad() before that zeroes it. Nothing to do where there is no .grad.
  void defer_grad_zero();
  Tensor detach() const;                                      // shares storage, no history
  void backward(const Tensor& grad_output = Tensor()) const;  // from a scalar when grad_output is undefined
  const std::string& name() const;
  Tensor& set_name(std::string name);

  // Note [Grad hook timing]: a grad-ready hook on a leaf fires exactly once per backward pass in which the
  // leaf receives a gradient, right after the last contribution has been accumulated into `.grad` — i.e. when
  // the engine runs the leaf's AccumulateGrad node, which it does only once every path to it has delivered
  // its gradient. Hooks run on the thread that called backward(), in registration order, in the engine's
  // reverse execution order across parameters (later-used parameters first). A leaf the pass does not reach
  // gets no call. Returns an id for remove_grad_ready_hook.
  int register_grad_ready_hook(GradReadyHook hook);
  void remove_grad_ready_hook(int id);
  // A hook on the gradient flowing into this tensor (non-leaf or leaf), before it propagates further.
  void register_grad_hook(GradHook hook);

 private:
  // copy_ and copy_streaming_ (`op` names the caller in errors; `streaming`: cpu::copy_streaming on the CPU).
  Tensor& copy_from(const Tensor& src, const char* op, bool streaming);
  std::shared_ptr<TensorImpl> impl_;
};

// Factories. Shapes must be non-negative.
Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor empty_strided(const Shape& shape, const Shape& strides, DType dtype, Device device);
// A contiguous host tensor in pinned_host_allocator()'s memory: page-locked when a GPU is present, so
// transfers to and from it run asynchronously (Tensor::copy_ stages host-to-device copies in it).
Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor arange(int64_t n, DType dtype = DType::i64, Device device = Device::cpu());
// A tensor over existing bytes of a storage (for flat buffers): shares `base`'s storage.
Tensor view_of_storage(const Tensor& base, const Shape& shape, int64_t offset_elems);

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu());

}  // namespace cz
