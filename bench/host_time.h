// The CPU benchmarks' clock and summary: the calling thread's CPU time and the median of repeated runs.
#pragma once

#include <time.h>

#include <algorithm>
#include <vector>

namespace cz::bench {

// CPU time of the calling thread: on a shared machine, what the work cost rather than how long it waited for
// a core.
inline double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The middle value (the upper one of an even count); `v` is not empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace cz::bench
