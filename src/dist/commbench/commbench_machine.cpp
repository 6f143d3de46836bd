// commbench's machine facts (the JSON's "machine"): what nccl-tests and the OSU benchmarks leave to the
// reader's notes, so that a result file says where it was measured.
#include <mpi.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "dist/comm/bootstrap.h"
#include "dist/comm/nvml.h"
#include "dist/comm/topology_detect.h"
#include "dist/commbench/commbench.h"
#if CZ_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace cz::dist {
namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "";
}

// 12040 -> "12.4"
std::string cuda_version_text(int v) {
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

nlohmann::ordered_json or_null(const std::string& s) {
  return s.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s);
}

}  // namespace

nlohmann::ordered_json machine_facts(World& world) {
  nlohmann::ordered_json m;
  m["host"] = world.hostname();
  m["cpu"] = or_null(cpu_model());
  m["cores"] = std::thread::hardware_concurrency();
  std::string why;
  const std::unique_ptr<Nvml> nvml = Nvml::open(&why);
  m["driver"] = nvml ? or_null(nvml->driver_version()) : nlohmann::ordered_json(nullptr);
  if (!nvml) m["driver_note"] = why;
  std::string cuda_driver, cuda_runtime, nccl;
#if CZ_WITH_CUDA
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) cuda_driver = cuda_version_text(v);
  if (cudaRuntimeGetVersion(&v) == cudaSuccess && v > 0) cuda_runtime = cuda_version_text(v);
  if (ncclGetVersion(&v) == ncclSuccess)
    nccl = v >= 10000 ? fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
                      : fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
#endif
  m["cuda_driver"] = or_null(cuda_driver);  // the CUDA version the driver supports
  m["cuda_runtime"] = or_null(cuda_runtime);
  m["nccl"] = or_null(nccl);
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string mpi_text(mpi, size_t(len));
  if (const size_t nl = mpi_text.find_first_of("\n,"); nl != std::string::npos) mpi_text.resize(nl);
  m["mpi"] = mpi_text;
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (int r = 0; r < world.size(); ++r)
    ranks.push_back({{"host", world.peer(r).host}, {"pid", world.peer(r).pid}});
  m["ranks"] = std::move(ranks);
  m["topology"] = detect_topology(world).to_json();
  return m;
}

}  // namespace cz::dist
