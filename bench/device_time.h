// The CUDA kernel benchmarks' clock: a call's mean time on the device, between two events on its stream.
#pragma once

#include "tensor/stream.h"

namespace cz::bench {

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
