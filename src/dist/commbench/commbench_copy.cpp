// commbench -o copy: host<->device copy bandwidth, pinned and pageable, each direction (and device to
// device), timed with CUDA events as CUDA's bandwidthTest does. Every rank measures its own GPU at the same
// time (as ranks share PCIe in training); rank 0 prints its figures.
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/comm/bootstrap.h"
#include "dist/commbench/commbench.h"
#include "tensor/allocator.h"
#include "tensor/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"

namespace cz::dist {

namespace {

using cuda_runtime::CopyKind;

// One copy to time: its direction, its host memory ("device" for device to device) and its ends.
struct CopyCase {
  const char* direction;
  const char* memory;
  void* dst;
  const void* src;
  CopyKind kind;
};

// --memory's host buffers each way, then device to device.
std::vector<CopyCase> copy_cases(const std::string& memory, void* dev, void* dev2, void* pinned,
                                 void* pageable) {
  std::vector<CopyCase> cases;
  for (const char* mem : {"pinned", "pageable"}) {
    if (memory != "both" && memory != mem) continue;
    void* host = std::strcmp(mem, "pinned") == 0 ? pinned : pageable;
    cases.push_back({"host_to_device", mem, dev, host, CopyKind::host_to_device});
    cases.push_back({"device_to_host", mem, host, dev, CopyKind::device_to_host});
  }
  cases.push_back({"device_to_device", "device", dev2, dev, CopyKind::device_to_device});
  return cases;
}

// The stream and the two events every copy is timed with, as bandwidthTest times them.
struct CopyTimer {
  Stream stream;
  void* start;
  void* stop;

  // Microseconds per copy of `bytes` in `c`, over o.iters copies after o.warmup.
  double time_us(const CopyCase& c, size_t bytes, const CommBenchOptions& o) const {
    for (int i = 0; i < o.warmup; ++i) cuda_runtime::memcpy_async(c.dst, c.src, bytes, c.kind, stream);
    cuda_runtime::event_record(start, stream);
    for (int i = 0; i < o.iters; ++i) cuda_runtime::memcpy_async(c.dst, c.src, bytes, c.kind, stream);
    cuda_runtime::event_record(stop, stream);
    cuda_runtime::event_synchronize(stop);
    return double(cuda_runtime::event_elapsed_ms(start, stop)) * 1e3 / std::max(1, o.iters);
  }
};

}  // namespace

int run_copy_bench(World& world, const CommBenchOptions& o, std::ostream& out) {
  CZ_CHECK_DEVICE(
      cuda_runtime::built() && cuda_available(),
      "commbench -o copy measures host<->device copies and needs a GPU (this build has {}, {} GPU(s) "
      "visible)",
      cuda_runtime::built() ? "CUDA" : "no CUDA", cuda_device_count());
  CZ_CHECK(o.memory == "pinned" || o.memory == "pageable" || o.memory == "both",
           "commbench: --memory takes pinned, pageable or both, not {}", o.memory);
  const int gpu = world.gpu() >= 0 ? world.gpu() : 0;
  const Device device = Device::cuda(gpu);
  cuda_runtime::set_device(gpu);
  const CopyTimer timer{Stream{device, cuda_runtime::stream_create(gpu)}, cuda_runtime::event_create(gpu),
                        cuda_runtime::event_create(gpu)};

  const bool print = world.rank() == 0;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  if (print && !o.json) {
    out << fmt::format(
        "# commbench copy: {} per rank, {} ranks copying at once, {} iterations per size (CUDA "
        "events)\n",
        device.str(), world.size(), o.iters);
    out << "#      direction      memory       size(B)    time(us)  bandwidth(GB/s)\n";
  }
  std::vector<int64_t> sizes;
  for (double b = double(o.min_bytes); b <= double(o.max_bytes) + 0.5;
       b = o.step_factor > 1 ? b * o.step_factor : b + double(o.step_bytes))
    sizes.push_back(int64_t(b));
  for (int64_t bytes : sizes) {
    const size_t nb = size_t(bytes);
    DataPtr dev = cuda_runtime::device_allocator(gpu).allocate(nb);
    DataPtr dev2 = cuda_runtime::device_allocator(gpu).allocate(nb);
    DataPtr pinned = cuda_runtime::pinned_allocator().allocate(nb);
    std::vector<char> pageable(nb, 1);
    std::memset(pinned.get(), 1, nb);
    for (const CopyCase& c : copy_cases(o.memory, dev.get(), dev2.get(), pinned.get(), pageable.data())) {
      const double us = timer.time_us(c, nb, o);
      const double gbps = double(bytes) / (us * 1e-6) / 1e9;
      if (!print) continue;
      if (o.json) {
        nlohmann::ordered_json row;
        row["direction"] = c.direction;
        row["memory"] = c.memory;
        row["size"] = bytes;
        row["time_us"] = us;
        row["bandwidth_GBps"] = gbps;
        rows.push_back(std::move(row));
      } else {
        out << fmt::format("{:>16}  {:>10}  {:>12}  {:>10.2f}  {:>15.2f}\n", c.direction, c.memory, bytes, us,
                           gbps);
      }
    }
  }
  if (print && o.json) {
    nlohmann::ordered_json doc;
    doc["op"] = "copy";
    doc["device"] = device.str();
    doc["ranks"] = world.size();
    doc["iters"] = o.iters;
    doc["results"] = std::move(rows);
    out << doc.dump(1) << "\n";
  }
  cuda_runtime::event_destroy(timer.start);
  cuda_runtime::event_destroy(timer.stop);
  cuda_runtime::stream_destroy(timer.stream.handle);
  return 0;
}

}  // namespace cz::dist
