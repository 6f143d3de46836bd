// Per-device CUDA backend state: the cuBLAS, cuBLASLt (+ per-stream workspace, algorithm cache) and cuDNN
// handles, created on first use, the named compute / communication / copy streams, and the switches between
// equivalent kernel paths. Kernels hold no state of their own: they receive a Stream and look the context up
// by the stream's device.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "tensor/allocator.h"
#include "tensor/stream.h"

namespace cz::cuda {

inline cudaStream_t native(Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

// Note [Current device]: since CUDA 12, cudaSetDevice creates the device's primary context (hundreds of MB).
// A guard that put back a thread's untouched default, device 0, would create a context on GPU 0 in every rank
// of a node. So a thread that never chose a device (through set_device or an earlier guard) adopts the
// guard's device for good; a thread that did choose gets its device back when the guard ends. Choose devices
// with set_device below, not cudaSetDevice, so the choice is known.

// Makes `device` current for the calling thread, and the process's default device (see adopt_default_device).
void set_device(int device);
int default_device();  // -1 until set_device was called
// For calls that have no device of their own (event queries, pinned memory): a thread that never chose a
// device adopts the process's default one first, so the call does not initialise a context on device 0.
void adopt_default_device();

// Makes `device` current for a scope (Note [Current device]). Kernel launchers open one for their stream's
// device, so a launch never lands on whatever device the calling thread last used.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();  // never throws
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Which kernels run depthwise convolutions (conv.cpp, depthwise.cu). All three are deterministic.
enum class DepthwiseAlgo {
  tiled,   // default: our tiled 7x7 kernels (Note [Tiled depthwise kernels]); other sizes on cuDNN
  cudnn,   // cuDNN wherever it has an algorithm (the tiled kernels, or the direct ones, where it has none)
  direct,  // our direct kernels, one thread per output: any kernel size; the simple reference path
};
const char* depthwise_algo_name(DepthwiseAlgo a);

// Note [Backend switches]: six switches choose between numerically equivalent paths (or, for TF32, trade
// f32 precision for speed; for reproducibility, allow a timed choice). They are state of the backend, so they
// live in each device's DeviceContext, next to the handles and caches they affect, and kernels read them from
// the context of their stream's device at each call. The functions below set one switch on every visible
// device, for callers that choose one setting for the process (the trainer, benchmarks); without a GPU they
// do nothing. Per-device setters are on DeviceContext.
void set_allow_tf32(bool allow);
void set_gemm_epilogues(bool enable);
void set_conv_benchmark(bool enable);
void set_reproducible(bool enable);
void set_depthwise_algo(DepthwiseAlgo algo);
void set_patchify_gemm(bool enable);
// Forgets every cached algorithm choice (cuDNN convolutions, cuBLASLt GEMMs) on every visible device, so the
// next call of each problem chooses afresh, as a new process would. For tests of reproducibility.
void clear_algorithm_caches();

// The algorithm chosen for one convolution problem and direction, with the workspace it needs.
struct ConvAlgo {
  bool found = false;  // false: cuDNN offered nothing usable (the query failed, or no candidate qualified)
  int algo = 0;        // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, by direction
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace_bytes = 0;
};

// What a cuBLASLt heuristic query returned for one GEMM problem: `found` is false when cuBLASLt has no
// algorithm for it (the caller then takes its fallback path).
struct LtAlgo {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
};

// How this device's GEMMs ran, for checking on a GPU which cuBLASLt epilogues are really fused.
struct GemmCounters {
  std::atomic<int64_t> lt{0};                  // cuBLASLt, with the requested epilogue if any
  std::atomic<int64_t> epilogue_fallbacks{0};  // epilogue requested, run unfused (plain GEMM + our kernels)
  std::atomic<int64_t> gemm_ex{0};             // no cuBLASLt algorithm at all: cublasGemmEx
};

// One per device, created on first use and never destroyed: handles freed at exit would race the CUDA
// runtime's own teardown.
class DeviceContext {
 public:
  explicit DeviceContext(int device);
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const { return device_; }
  int sm_count() const { return sm_count_; }

  // Switches (Note [Backend switches]); each takes effect at the next kernel call on this device.
  // TF32 tensor cores for f32 GEMMs and convolutions: about 3x faster on Ampere and later, with a 10-bit
  // mantissa in the products. Off by default so f32 results match the CPU backend to ~1e-6.
  bool allow_tf32() const { return allow_tf32_.load(std::memory_order_relaxed); }
  void set_allow_tf32(bool on) { allow_tf32_.store(on, std::memory_order_relaxed); }
  // cuBLASLt epilogues (bias, bias gradient) fused into GEMMs. On by default; off runs the same math as a
  // plain GEMM plus our own kernels, which the tests use to check one path against the other.
  bool gemm_epilogues() const { return gemm_epilogues_.load(std::memory_order_relaxed); }
  void set_gemm_epilogues(bool on) { gemm_epilogues_.store(on, std::memory_order_relaxed); }
  // How cuDNN convolution algorithms are chosen (Note [Convolution algorithms] in conv.cpp): by cuDNN's
  // heuristics (default: no host synchronisation, no trial runs), or by timing every candidate once per
  // problem (cudnnFind*Ex, like PyTorch's cudnn.benchmark: the first call of each shape synchronises). The
  // timed search runs only with reproducible() off.
  bool conv_benchmark() const { return conv_benchmark_.load(std::memory_order_relaxed); }
  void set_conv_benchmark(bool on) { conv_benchmark_.store(on, std::memory_order_relaxed); }
  // Note [Reproducible runs]: on by default, every algorithm choice is a function of the problem, the
  // library versions and the GPU model only, never of timings, so a run repeats bit for bit in a new
  // process: cuDNN's candidates come from its heuristics even under conv_benchmark (a timed search picks
  // among deterministic algorithms whichever was fastest that time, and two of them sum in different
  // orders), cuBLASLt's from its heuristic query (no timing anywhere). Off lets conv_benchmark time them.
  bool reproducible() const { return reproducible_.load(std::memory_order_relaxed); }
  void set_reproducible(bool on) { reproducible_.store(on, std::memory_order_relaxed); }
  // Which kernels run depthwise convolutions (DepthwiseAlgo). The tests compare the paths.
  DepthwiseAlgo depthwise_algo() const { return depthwise_algo_.load(std::memory_order_relaxed); }
  void set_depthwise_algo(DepthwiseAlgo algo) { depthwise_algo_.store(algo, std::memory_order_relaxed); }
  // Patchify convolutions as one GEMM over their patches (Note [Patchify as a GEMM] in patches.h) even where
  // cuDNN has an algorithm. Off by default; used anyway for problems cuDNN cannot run.
  bool patchify_gemm() const { return patchify_gemm_.load(std::memory_order_relaxed); }
  void set_patchify_gemm(bool on) { patchify_gemm_.store(on, std::memory_order_relaxed); }

  // A library handle bound to `stream`. Handles are shared by every thread using this device, so a lease
  // holds a lock for its lifetime: keep leases short (enqueue work, never wait on it).
  struct BlasLease {
    cublasHandle_t handle;
    std::unique_lock<std::mutex> lock;
  };
  struct LtLease {
    cublasLtHandle_t handle;
    void* workspace;  // reserved for work on `stream` only: two streams never share one
    size_t workspace_bytes;
    std::unordered_map<std::string, LtAlgo>* algos;  // heuristic results by problem key
    std::unique_lock<std::mutex> lock;
  };
  struct DnnLease {
    cudnnHandle_t handle;
    std::unordered_map<std::string, ConvAlgo>* conv_algos;  // by problem and direction
    std::unique_lock<std::mutex> lock;
  };
  BlasLease cublas(Stream stream);
  LtLease cublaslt(Stream stream);
  DnnLease cudnn(Stream stream);

  // Non-blocking streams (no implicit synchronisation with the legacy default stream), created on first use.
  // The communication stream has the highest priority the device offers, so collectives are not starved by
  // the compute kernels they overlap with.
  Stream compute_stream();
  Stream comm_stream();
  Stream copy_stream();

  // cuDNN workspace of `stream`, at least `bytes` long: grown (never shrunk) on demand and kept, so
  // steady-state training allocates nothing. Needs the cuDNN lease (its lock guards the map); the pointer is
  // valid for work queued on `stream` until the next call for the same stream.
  void* cudnn_workspace(const DnnLease& lease, Stream stream, size_t bytes);
  // The largest of those workspaces, in bytes (0 before any).
  size_t cudnn_workspace_bytes();

  GemmCounters& gemm_counters() { return gemm_counters_; }

  // Forgets the cached cuDNN and cuBLASLt algorithm choices (the workspaces stay).
  void clear_algorithm_caches();

 private:
  Stream lazy_stream(std::atomic<void*>& slot, bool high_priority);
  std::pair<void*, size_t> workspace(Stream stream);  // cuBLAS(Lt) workspace of one stream

  const int device_;
  int sm_count_ = 0;
  int cc_major_ = 0;

  std::mutex blas_mu_, lt_mu_, dnn_mu_, stream_mu_, ws_mu_;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  std::unordered_map<void*, DataPtr> workspaces_;  // by stream handle
  std::unordered_map<std::string, LtAlgo> lt_algos_;
  std::unordered_map<std::string, ConvAlgo> conv_algos_;
  std::unordered_map<void*, DataPtr> dnn_workspaces_;  // by stream handle; guarded by dnn_mu_
  std::atomic<void*> compute_{nullptr}, comm_{nullptr}, copy_{nullptr};
  GemmCounters gemm_counters_;
  std::atomic<bool> allow_tf32_{false}, gemm_epilogues_{true}, conv_benchmark_{false}, reproducible_{true},
      patchify_gemm_{false};
  std::atomic<DepthwiseAlgo> depthwise_algo_{DepthwiseAlgo::tiled};
};

// The context of a visible device (DeviceError otherwise).
DeviceContext& context(int device);

inline Stream compute_stream(int device) {
  return context(device).compute_stream();
}
inline Stream comm_stream(int device) {
  return context(device).comm_stream();
}
inline Stream copy_stream(int device) {
  return context(device).copy_stream();
}

}  // namespace cz::cuda
