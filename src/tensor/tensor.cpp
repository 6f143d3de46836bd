// Tensor basics: shape helpers, factories, copies, in-place updates, host reads, autograd accessors.
#include "tensor/tensor.h"

#include <algorithm>

#include "tensor/autograd/engine.h"
#include "tensor/autograd/node.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/dispatch.h"
#include "tensor/profiler.h"

namespace cz {

std::string shape_str(const Shape& s) {
  if (s.size() == 1) return fmt::format("({})", s[0]);
  return fmt::format("({})", fmt::join(s, ", "));
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = -std::max<int64_t>(ndim, 1), hi = std::max<int64_t>(ndim, 1) - 1;
  CZ_CHECK_SHAPE(dim >= lo && dim <= hi, "{}: dimension {} out of range for a {}-d tensor", op, dim, ndim);
  return dim < 0 ? dim + ndim : dim;
}

int64_t Tensor::size(int64_t d) const {
  return sizes()[size_t(wrap_dim(d, dim(), "size"))];
}
int64_t Tensor::stride(int64_t d) const {
  return strides()[size_t(wrap_dim(d, dim(), "stride"))];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = impl_->sizes.size(); i-- > 0;) {
    if (impl_->sizes[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->sizes[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return fmt::format("{} {} {}", dtype_name(dtype()), shape_str(sizes()), device().str());
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * int64_t(element_size());
}

// ---- factories ----

namespace {
Tensor empty_from(Allocator& alloc, const Shape& shape, const Shape& strides, DType dtype, Device device) {
  CZ_CHECK_SHAPE(shape.size() == strides.size(), "empty_strided: {} sizes but {} strides", shape.size(),
                 strides.size());
  int64_t span = 1;  // elements from the first to one past the last addressable element
  for (size_t i = 0; i < shape.size(); ++i) {
    CZ_CHECK_SHAPE(shape[i] >= 0, "negative size in shape {}", shape_str(shape));
    if (shape[i] == 0) span = 0;
  }
  if (span != 0)
    for (size_t i = 0; i < shape.size(); ++i) span += (shape[i] - 1) * strides[i];
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(alloc.allocate(size_t(span) * dtype_size(dtype)), device);
  impl->sizes = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}
}  // namespace

Tensor empty_strided(const Shape& shape, const Shape& strides, DType dtype, Device device) {
  return empty_from(allocator_for(device), shape, strides, dtype, device);
}
Tensor empty_pinned(const Shape& shape, DType dtype) {
  return empty_from(pinned_host_allocator(), shape, contiguous_strides(shape), dtype, Device::cpu());
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  return empty_strided(shape, contiguous_strides(shape), dtype, device);
}
Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return empty(shape, dtype, device).zero_();
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  return empty(shape, dtype, device).fill_(value);
}
Tensor empty_like(const Tensor& t) {
  return empty(t.sizes(), t.dtype(), t.device());
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.sizes(), t.dtype(), t.device());
}

Tensor arange(int64_t n, DType dtype, Device device) {
  CZ_CHECK(n >= 0, "arange: n must be non-negative, got {}", n);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i);
  return from_vector(v, {n}).to(dtype).to(device);
}

Tensor view_of_storage(const Tensor& base, const Shape& shape, int64_t offset_elems) {
  const int64_t n = shape_numel(shape);
  const int64_t capacity = int64_t(base.storage()->nbytes() / base.element_size());
  CZ_CHECK_SHAPE(offset_elems >= 0 && offset_elems + n <= capacity,
                 "view_of_storage: {} elements at offset {} do not fit a storage of {} elements", n,
                 offset_elems, capacity);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->offset = offset_elems;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  CZ_CHECK_SHAPE(int64_t(values.size()) == shape_numel(shape), "from_vector: {} values for shape {}",
                 values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>, Device::cpu());
  std::copy(values.begin(), values.end(), t.data<T>());
  return device.is_cpu() ? t : t.to(device);
}
template Tensor from_vector(const std::vector<float>&, const Shape&, Device);
template Tensor from_vector(const std::vector<double>&, const Shape&, Device);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<uint8_t>&, const Shape&, Device);
template Tensor from_vector(const std::vector<Half>&, const Shape&, Device);
template Tensor from_vector(const std::vector<BFloat16>&, const Shape&, Device);

// ---- in-place updates ----

namespace {
void check_writable(const Tensor& t, const char* op) {
  CZ_CHECK(!(GradMode::enabled() && t.requires_grad()),
           "{}: in-place update of a tensor that requires grad while grad mode is on (use NoGradGuard)", op);
}
}  // namespace

Tensor& Tensor::zero_() {
  return fill_(0.0);
}

Tensor& Tensor::fill_(double value) {
  check_writable(*this, "fill_");
  profiler::Scope prof("fill", device());
  if (is_cpu())
    cpu::fill(*this, value);
  else
    CZ_CUDA_CALL(cuda::fill(*this, value, current_stream(device())));
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  return copy_from(src, "copy_", /*streaming=*/false);
}

Tensor& Tensor::copy_streaming_(const Tensor& src) {
  return copy_from(src, "copy_streaming_", /*streaming=*/true);
}

Tensor& Tensor::copy_from(const Tensor& src, const char* op, bool streaming) {
  check_writable(*this, op);
  CZ_CHECK_SHAPE(src.sizes() == sizes(), "{}: source shape {} does not match destination shape {}", op,
                 shape_str(src.sizes()), shape_str(sizes()));
  profiler::Scope prof(src.device() != device() ? "transfer"
                       : src.dtype() != dtype() ? "cast"
                                                : "copy",
                       is_cuda() ? device() : src.device());
  if (is_cpu() && src.is_cpu()) {
    if (streaming)
      cpu::copy_streaming(src, *this);
    else
      cpu::copy(src, *this);
  } else if (is_cuda() && src.is_cuda() && device() == src.device()) {
    CZ_CUDA_CALL(cuda::copy(src, *this, current_stream(device())));
  } else {
    // Across devices: stage a contiguous copy in the destination's dtype, then one transfer.
    const Device gpu = is_cuda() ? device() : src.device();
    const Stream stream = current_stream(gpu);
    if (is_cuda() && src.is_cuda()) {  // GPU to another GPU, through the host
      copy_(src.cpu());
    } else if (is_cuda()) {
      // Without blocking the host: the source is converted into pinned staging memory, which is recorded
      // on the stream so that it is not handed out again before the copy has read it (Note [Cross-stream
      // frees]). The caller may change or free `src` as soon as this returns.
      Tensor host = empty_pinned(sizes(), dtype());
      cpu::copy(src, host);
      Tensor dst = is_contiguous() ? *this : empty(sizes(), dtype(), device());
      cuda_runtime::memcpy_async(dst.raw_data(), host.raw_data(), nbytes(),
                                 cuda_runtime::CopyKind::host_to_device, stream);
      pinned_host_allocator().record_stream(host.raw_data(), stream);
      if (!dst.same(*this)) CZ_CUDA_CALL(cuda::copy(dst, *this, stream));
    } else {
      Tensor dev = src.contiguous();
      Tensor host = empty_pinned(sizes(), src.dtype());
      cuda_runtime::memcpy_async(host.raw_data(), dev.raw_data(), host.nbytes(),
                                 cuda_runtime::CopyKind::device_to_host, stream);
      stream.synchronize();
      cpu::copy(host, *this);
    }
  }
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_writable(*this, "add_");
  CZ_CHECK_SHAPE(other.sizes() == sizes(), "add_: shapes {} and {} differ", shape_str(sizes()),
                 shape_str(other.sizes()));
  CZ_CHECK_DEVICE(other.device() == device(), "add_: tensors on {} and {}", device().str(),
                  other.device().str());
  if (is_cpu())
    cpu::axpy(other, alpha, *this);
  else
    CZ_CUDA_CALL(cuda::axpy(other, alpha, *this, current_stream(device())));
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::mul_(double factor) {
  check_writable(*this, "mul_");
  if (is_cpu())
    cpu::scale(*this, factor);
  else
    CZ_CUDA_CALL(cuda::scale(*this, factor, current_stream(device())));
  storage()->bump_version();
  return *this;
}

// ---- host reads ----

double Tensor::item() const {
  CZ_CHECK_SHAPE(numel() == 1, "item: tensor has {} elements, expected 1", numel());
  return to_vector<double>()[0];
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = detach().to(Device::cpu()).to(dtype_of<T>).contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}
template std::vector<float> Tensor::to_vector() const;
template std::vector<double> Tensor::to_vector() const;
template std::vector<int32_t> Tensor::to_vector() const;
template std::vector<int64_t> Tensor::to_vector() const;
template std::vector<uint8_t> Tensor::to_vector() const;

// ---- autograd accessors ----

Tensor& Tensor::set_requires_grad(bool value) {
  CZ_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can be marked (this one is the output of {})",
           impl_->autograd->grad_fn->name());
  CZ_CHECK_DTYPE(!value || is_floating(dtype()), "set_requires_grad: a {} tensor cannot require grad",
                 dtype_name(dtype()));
  impl_->meta().requires_grad = value;
  return *this;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> none;
  return impl_->autograd ? impl_->autograd->grad_fn : none;
}

Tensor Tensor::grad() const {
  AutogradMeta* meta = impl_->autograd.get();
  if (!meta || !meta->grad) return Tensor();
  Tensor g(meta->grad);
  if (meta->grad_zero_deferred) {  // no gradient arrived since defer_grad_zero()
    meta->grad_zero_deferred = false;
    NoGradGuard no_grad;
    g.zero_();
  }
  return g;
}

void Tensor::defer_grad_zero() {
  if (impl_->autograd && impl_->autograd->grad) impl_->autograd->grad_zero_deferred = true;
}

void Tensor::set_grad(const Tensor& g) {
  if (g.defined()) {
    CZ_CHECK_SHAPE(g.sizes() == sizes(), "set_grad: gradient shape {} does not match tensor shape {}",
                   shape_str(g.sizes()), shape_str(sizes()));
    CZ_CHECK_DTYPE(g.dtype() == dtype(), "set_grad: gradient dtype {} does not match tensor dtype {}",
                   dtype_name(g.dtype()), dtype_name(dtype()));
    CZ_CHECK_DEVICE(g.device() == device(), "set_grad: gradient on {} but tensor on {}", g.device().str(),
                    device().str());
  }
  impl_->meta().grad = g.impl_ptr();
  impl_->meta().grad_zero_deferred = false;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->sizes = impl_->sizes;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& grad_output) const {
  run_backward({*this}, {grad_output});
}

const std::string& Tensor::name() const {
  static const std::string none;
  return impl_->autograd ? impl_->autograd->name : none;
}
Tensor& Tensor::set_name(std::string name) {
  impl_->meta().name = std::move(name);
  return *this;
}

int Tensor::register_grad_ready_hook(GradReadyHook hook) {
  CZ_CHECK(is_leaf() && requires_grad(), "register_grad_ready_hook: only for leaf tensors that require grad");
  auto& hooks = impl_->meta().grad_ready_hooks;
  const int id = hooks.empty() ? 0 : hooks.back().first + 1;
  hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_grad_ready_hook(int id) {
  if (!impl_->autograd) return;
  auto& hooks = impl_->autograd->grad_ready_hooks;
  std::erase_if(hooks, [id](const auto& h) { return h.first == id; });
}

void Tensor::register_grad_hook(GradHook hook) {
  CZ_CHECK(requires_grad(), "register_grad_hook: tensor does not require grad");
  if (grad_fn())
    grad_fn()->add_pre_hook(output_nr(), std::move(hook));
  else
    impl_->meta().grad_hooks.push_back(std::move(hook));
}

}  // namespace cz
