// The CUDA kernel benchmarks' clock: a call's mean time on the device, between two events on its stream.
#pragma once

#include <cstdio>

#include "tensor/device.h"
#include "tensor/stream.h"

namespace cz::bench {

// True, after "<program>: no CUDA GPU is visible" on stderr, when there is no GPU to measure.
inline bool no_gpu(const char* program) {
  if (cuda_device_count() > 0) return false;
  std::fprintf(stderr, "%s: no CUDA GPU is visible\n", program);
  return true;
}

// The mean time of `fn` in ms over `iters` calls queued on `s`, after two untimed calls (the first chooses
// cuDNN's algorithm, or asks cuBLASLt's heuristic).
template <class Fn>
double device_ms(Device dev, const Stream& s, int iters, Fn&& fn) {
  for (int i = 0; i < 2; ++i) fn();
  Event start(dev), end(dev);
  start.record(s);
  for (int i = 0; i < iters; ++i) fn();
  end.record(s);
  end.synchronize();
  return double(start.elapsed_ms(end)) / iters;
}

}  // namespace cz::bench
