// Per-device backend context: lazily created library handles, cuBLASLt workspaces per stream, named streams,
// kernel-path switches.
#include "tensor/cuda/context.h"

#include <algorithm>
#include <array>

#include "tensor/cuda/allocator.h"
#include "tensor/cuda/status.h"

namespace cz::cuda {
namespace {
constexpr int kMaxDevices = 16;
std::atomic<int> g_default_device{-1};
thread_local bool t_device_chosen = false;  // Note [Current device]
}  // namespace

void set_device(int device) {
  CZ_CHECK_STATUS(cudaSetDevice(device));
  t_device_chosen = true;
  g_default_device.store(device, std::memory_order_relaxed);
}

int default_device() {
  return g_default_device.load(std::memory_order_relaxed);
}

void adopt_default_device() {
  if (t_device_chosen) return;
  const int device = default_device();
  if (device < 0) return;
  CZ_CHECK_STATUS(cudaSetDevice(device));
  t_device_chosen = true;
}

DeviceGuard::DeviceGuard(int device) {
  if (!t_device_chosen) {  // adopt `device` for good: Note [Current device]
    CZ_CHECK_STATUS(cudaSetDevice(device));
    t_device_chosen = true;
    return;
  }
  int now = -1;
  CZ_CHECK_STATUS(cudaGetDevice(&now));
  if (now == device) return;
  CZ_CHECK_STATUS(cudaSetDevice(device));
  prev_ = now;
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) (void)cudaSetDevice(prev_);
}

namespace {
// Applies `set` to the context of every visible device (Note [Backend switches]).
template <class Set>
void on_every_device(Set set) {
  for (int d = 0, n = std::min(cuda_device_count(), kMaxDevices); d < n; ++d) set(context(d));
}
}  // namespace

void set_allow_tf32(bool allow) {
  on_every_device([&](DeviceContext& c) { c.set_allow_tf32(allow); });
}
void set_gemm_epilogues(bool enable) {
  on_every_device([&](DeviceContext& c) { c.set_gemm_epilogues(enable); });
}
void set_conv_benchmark(bool enable) {
  on_every_device([&](DeviceContext& c) { c.set_conv_benchmark(enable); });
}
void set_reproducible(bool enable) {
  on_every_device([&](DeviceContext& c) { c.set_reproducible(enable); });
}
void set_depthwise_algo(DepthwiseAlgo algo) {
  on_every_device([&](DeviceContext& c) { c.set_depthwise_algo(algo); });
}
void clear_algorithm_caches() {
  on_every_device([&](DeviceContext& c) { c.clear_algorithm_caches(); });
}

const char* depthwise_algo_name(DepthwiseAlgo a) {
  switch (a) {
    case DepthwiseAlgo::tiled:
      return "tiled";
    case DepthwiseAlgo::cudnn:
      return "cudnn";
    case DepthwiseAlgo::direct:
      return "direct";
  }
  return "?";
}
void set_patchify_gemm(bool enable) {
  on_every_device([&](DeviceContext& c) { c.set_patchify_gemm(enable); });
}

DeviceContext::DeviceContext(int device) : device_(device) {
  CZ_CHECK_STATUS(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  CZ_CHECK_STATUS(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device));
}

DeviceContext::BlasLease DeviceContext::cublas(Stream stream) {
  CZ_ASSERT(stream.device == Device::cuda(device_), "cuBLAS handle of cuda:{} for a stream on {}", device_,
            stream.device.str());
  std::unique_lock<std::mutex> lock(blas_mu_);
  if (!blas_) {
    DeviceGuard guard(device_);
    CZ_CHECK_STATUS(cublasCreate(&blas_));
  }
  // cublasSetStream resets the workspace to cuBLAS's own pool; give it this stream's instead, so that the
  // bytes are counted by the allocator and never shared by two streams.
  const auto [ws, ws_bytes] = workspace(stream);
  CZ_CHECK_STATUS(cublasSetStream(blas_, native(stream)));
  CZ_CHECK_STATUS(cublasSetWorkspace(blas_, ws, ws_bytes));
  return {blas_, std::move(lock)};
}

DeviceContext::LtLease DeviceContext::cublaslt(Stream stream) {
  CZ_ASSERT(stream.device == Device::cuda(device_), "cuBLASLt handle of cuda:{} for a stream on {}", device_,
            stream.device.str());
  std::unique_lock<std::mutex> lock(lt_mu_);
  if (!lt_) {
    DeviceGuard guard(device_);
    CZ_CHECK_STATUS(cublasLtCreate(&lt_));
  }
  const auto [ws, ws_bytes] = workspace(stream);
  return {lt_, ws, ws_bytes, &lt_algos_, std::move(lock)};
}

std::pair<void*, size_t> DeviceContext::workspace(Stream stream) {
  std::lock_guard<std::mutex> lock(ws_mu_);
  auto it = workspaces_.find(stream.handle);
  if (it == workspaces_.end()) {
    // NVIDIA's recommendation for cuBLAS(Lt): 32 MiB on Hopper and later, 4 MiB before. One per stream: a
    // GEMM in flight owns the workspace until it finishes, and only work on the same stream is ordered after
    // it.
    const size_t bytes = cc_major_ >= 9 ? (size_t(32) << 20) : (size_t(4) << 20);
    it = workspaces_.emplace(stream.handle, allocate(bytes, stream)).first;
  }
  return {it->second.get(), it->second.nbytes()};
}

DeviceContext::DnnLease DeviceContext::cudnn(Stream stream) {
  CZ_ASSERT(stream.device == Device::cuda(device_), "cuDNN handle of cuda:{} for a stream on {}", device_,
            stream.device.str());
  std::unique_lock<std::mutex> lock(dnn_mu_);
  if (!dnn_) {
    DeviceGuard guard(device_);
    CZ_CHECK_STATUS(cudnnCreate(&dnn_));
  }
  CZ_CHECK_STATUS(cudnnSetStream(dnn_, native(stream)));
  return {dnn_, &conv_algos_, std::move(lock)};
}

void* DeviceContext::cudnn_workspace(const DnnLease& lease, Stream stream, size_t bytes) {
  CZ_ASSERT(lease.lock.owns_lock() && lease.lock.mutex() == &dnn_mu_,
            "cudnn_workspace without the cuDNN lease");
  if (bytes == 0) return nullptr;
  DataPtr& ws = dnn_workspaces_[stream.handle];
  // The old block is freed on its home stream, so work already queued on `stream` still owns it until done
  // (Note [Cross-stream frees]).
  if (ws.nbytes() < bytes) ws = allocate(bytes, stream);
  return ws.get();
}

size_t DeviceContext::cudnn_workspace_bytes() {
  std::lock_guard<std::mutex> lock(dnn_mu_);
  size_t most = 0;
  for (const auto& [stream, ws] : dnn_workspaces_) most = std::max(most, ws.nbytes());
  return most;
}

void DeviceContext::clear_algorithm_caches() {
  {
    std::lock_guard<std::mutex> lock(dnn_mu_);
    conv_algos_.clear();
  }
  std::lock_guard<std::mutex> lock(lt_mu_);
  lt_algos_.clear();
}

Stream DeviceContext::lazy_stream(std::atomic<void*>& slot, bool high_priority) {
  void* s = slot.load(std::memory_order_acquire);
  if (!s) {
    std::lock_guard<std::mutex> lock(stream_mu_);
    s = slot.load(std::memory_order_relaxed);
    if (!s) {
      DeviceGuard guard(device_);
      int least = 0, greatest = 0;
      CZ_CHECK_STATUS(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      cudaStream_t created = nullptr;
      CZ_CHECK_STATUS(
          cudaStreamCreateWithPriority(&created, cudaStreamNonBlocking, high_priority ? greatest : least));
      s = created;
      slot.store(s, std::memory_order_release);
    }
  }
  return Stream{Device::cuda(device_), s};
}

Stream DeviceContext::compute_stream() {
  return lazy_stream(compute_, false);
}
Stream DeviceContext::comm_stream() {
  return lazy_stream(comm_, true);
}
Stream DeviceContext::copy_stream() {
  return lazy_stream(copy_, false);
}

DeviceContext& context(int device) {
  const int n = cuda_device_count();
  CZ_CHECK_DEVICE(device >= 0 && device < n && device < kMaxDevices,
                  "cuda:{} is not available ({} CUDA device{} visible)", device, n, n == 1 ? "" : "s");
  static std::array<std::atomic<DeviceContext*>, kMaxDevices> contexts{};
  static std::mutex mu;
  DeviceContext* c = contexts[size_t(device)].load(std::memory_order_acquire);
  if (c) return *c;
  std::lock_guard<std::mutex> lock(mu);
  c = contexts[size_t(device)].load(std::memory_order_relaxed);
  if (!c) {
    c = new DeviceContext(device);
    contexts[size_t(device)].store(c, std::memory_order_release);
  }
  return *c;
}

}  // namespace cz::cuda
