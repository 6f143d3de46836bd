// The model's input from a batch of 8-bit pixels (Note [Normalising on the device],
// src/io/data/model_input.h): one thread per output element, the arithmetic of model_input_element.h, reading
// the pixels and the draws from pinned host memory through unified addressing.
#include "tensor/cuda/device_utils.cuh"
#include "tensor/cuda/model_input_element.h"

namespace cz::cuda::launch {
namespace {
using namespace detail;

__global__ void model_input_kernel(const batch_input::BatchView b, int64_t total, float* __restrict__ out) {
  for (int64_t e = global_thread(); e < total; e += grid_threads()) out[e] = batch_input::element_at(b, e);
}

}  // namespace

cudaError_t model_input(const Config& cfg, const batch_input::BatchView& b, int64_t n, float* out) {
  const int64_t total = n * b.height * b.width * 3;
  if (total == 0) return cudaSuccess;
  model_input_kernel<<<grid_for(total, cfg.sm_count), kThreads, 0, cfg.stream>>>(b, total, out);
  return cudaGetLastError();
}

}  // namespace cz::cuda::launch
