// The GPUs' peer copies for commbench --op sendrecv and --check-p2p, as CUDA's p2pBandwidthLatencyTest
// measures them: between every ordered pair of the devices this process sees, cudaMemcpyPeerAsync timed with
// events on the source device's stream, once with peer access disabled (the driver stages through the host)
// and once enabled where the pair allows it. Unrun on a GPU so far: compiled only (docs/comm.md).
#include <ostream>

#include <fmt/format.h>

#include "dist/commbench/bench_internal.h"
#if CZ_WITH_CUDA
#include <cuda_runtime.h>

#include "dist/comm/cuda/cuda_check.h"
#endif

namespace cz::dist {

#if CZ_WITH_CUDA
namespace {

#define CZ_P2P_CUDA(stmt) CZ_CUDA_COMM(stmt)

// Enables (or disables) peer access from every device to every other that can reach it; returns which pairs
// have it on. A pair already in the asked state is not an error.
std::vector<std::vector<bool>> set_peer_access(int n, bool on) {
  std::vector<std::vector<bool>> access(size_t(n), std::vector<bool>(size_t(n), false));
  for (int i = 0; i < n; ++i) {
    CZ_P2P_CUDA(cudaSetDevice(i));
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      int can = 0;
      CZ_P2P_CUDA(cudaDeviceCanAccessPeer(&can, i, j));
      if (!can) continue;
      const cudaError_t e = on ? cudaDeviceEnablePeerAccess(j, 0) : cudaDeviceDisablePeerAccess(j);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled && e != cudaErrorPeerAccessNotEnabled)
        CZ_P2P_CUDA(e);
      (void)cudaGetLastError();  // the "already" codes are sticky until read
      access[size_t(i)][size_t(j)] = on;
    }
  }
  return access;
}

struct PeerBuffers {
  std::vector<void*> buf;
  std::vector<cudaStream_t> stream;
  explicit PeerBuffers(int n, int64_t bytes) {
    for (int i = 0; i < n; ++i) {
      CZ_P2P_CUDA(cudaSetDevice(i));
      void* p = nullptr;
      CZ_P2P_CUDA(cudaMalloc(&p, size_t(std::max<int64_t>(bytes, 4))));
      buf.push_back(p);
      cudaStream_t s = nullptr;
      CZ_P2P_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      stream.push_back(s);
    }
  }
  ~PeerBuffers() {
    for (size_t i = 0; i < buf.size(); ++i) {
      cudaSetDevice(int(i));
      cudaFree(buf[i]);
      cudaStreamDestroy(stream[i]);
    }
  }
};

// Seconds per copy of `bytes` from device a to device b, over `reps` copies on a's stream.
double time_copies(PeerBuffers& p, int a, int b, int64_t bytes, int reps) {
  CZ_P2P_CUDA(cudaSetDevice(a));
  cudaEvent_t start, stop;
  CZ_P2P_CUDA(cudaEventCreate(&start));
  CZ_P2P_CUDA(cudaEventCreate(&stop));
  CZ_P2P_CUDA(
      cudaMemcpyPeerAsync(p.buf[size_t(b)], b, p.buf[size_t(a)], a, size_t(bytes), p.stream[size_t(a)]));
  CZ_P2P_CUDA(cudaEventRecord(start, p.stream[size_t(a)]));
  for (int r = 0; r < reps; ++r)
    CZ_P2P_CUDA(
        cudaMemcpyPeerAsync(p.buf[size_t(b)], b, p.buf[size_t(a)], a, size_t(bytes), p.stream[size_t(a)]));
  CZ_P2P_CUDA(cudaEventRecord(stop, p.stream[size_t(a)]));
  CZ_P2P_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CZ_P2P_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3 / reps;
}

int visible_devices(std::string* note) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  (void)cudaGetLastError();
  if (n < 2 && note) *note = fmt::format("{} GPU(s) visible to this process: no pair to copy between", n);
  return n;
}

}  // namespace

nlohmann::ordered_json cuda_peer_matrix(int64_t bytes, int iters, std::ostream* out, std::string* note) {
  const int n = visible_devices(note);
  if (n < 2) return nullptr;
  nlohmann::ordered_json doc;
  nlohmann::ordered_json devices = nlohmann::ordered_json::array();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    CZ_P2P_CUDA(cudaGetDeviceProperties(&prop, i));
    char bus[32] = {0};
    cudaDeviceGetPCIBusId(bus, sizeof bus, i);
    devices.push_back({{"index", i}, {"name", prop.name}, {"busid", bus}});
  }
  doc["devices"] = std::move(devices);
  doc["bytes"] = bytes;
  PeerBuffers p(n, bytes);
  for (const bool on : {false, true}) {
    const auto access = set_peer_access(n, on);
    std::vector<double> bw(size_t(n * n)), lat(size_t(n * n));
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        bw[size_t(a * n + b)] = double(bytes) / time_copies(p, a, b, bytes, iters) / 1e9;
        lat[size_t(a * n + b)] = time_copies(p, a, b, 4, std::max(iters, 100)) * 1e6;
      }
    const char* key = on ? "peer_on" : "peer_off";
    doc["bandwidth_GBps"][key] = matrix_json(bw, n);
    doc["latency_us"][key] = matrix_json(lat, n);
    nlohmann::ordered_json acc = nlohmann::ordered_json::array();
    for (const auto& row : access) acc.push_back(row);
    doc["peer_access"][key] = std::move(acc);
    if (out) {
      *out << fmt::format("# peer copies, peer access {}: bandwidth (GB/s) at {} bytes\n", on ? "on" : "off",
                          bytes);
      print_matrix(*out, bw, n, 9);
      *out << fmt::format("# peer copies, peer access {}: latency (us) of 4 bytes\n", on ? "on" : "off");
      print_matrix(*out, lat, n, 9);
    }
  }
  set_peer_access(n, false);
  return doc;
}

std::vector<std::string> cuda_peer_check(int64_t bytes, std::string* note) {
  std::vector<std::string> failures;
  const int n = visible_devices(note);
  if (n < 2) return failures;
  PeerBuffers p(n, bytes);
  std::vector<unsigned char> want(static_cast<size_t>(bytes)), got(static_cast<size_t>(bytes));
  for (const bool on : {false, true}) {
    const auto access = set_peer_access(n, on);
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        for (int64_t i = 0; i < bytes; ++i)
          want[size_t(i)] = (unsigned char)((i * 131 + a * 31 + b * 17 + on) | 1);
        CZ_P2P_CUDA(cudaSetDevice(a));
        CZ_P2P_CUDA(cudaMemcpy(p.buf[size_t(a)], want.data(), size_t(bytes), cudaMemcpyHostToDevice));
        CZ_P2P_CUDA(cudaSetDevice(b));
        CZ_P2P_CUDA(cudaMemset(p.buf[size_t(b)], 0, size_t(bytes)));
        CZ_P2P_CUDA(cudaDeviceSynchronize());
        CZ_P2P_CUDA(cudaMemcpyPeer(p.buf[size_t(b)], b, p.buf[size_t(a)], a, size_t(bytes)));
        CZ_P2P_CUDA(cudaMemcpy(got.data(), p.buf[size_t(b)], size_t(bytes), cudaMemcpyDeviceToHost));
        int64_t wrong = 0, first = -1;
        for (int64_t i = 0; i < bytes; ++i)
          if (got[size_t(i)] != want[size_t(i)]) {
            if (first < 0) first = i;
            ++wrong;
          }
        if (wrong)
          failures.push_back(
              fmt::format("GPU {} -> GPU {} (peer access {}): {} of {} bytes wrong, first at byte {} "
                          "(0x{:02x}, expected 0x{:02x})",
                          a, b, access[size_t(a)][size_t(b)] ? "on" : "off", wrong, bytes, first,
                          got[size_t(first)], want[size_t(first)]));
      }
  }
  set_peer_access(n, false);
  return failures;
}

#else

nlohmann::ordered_json cuda_peer_matrix(int64_t, int, std::ostream*, std::string* note) {
  if (note) *note = "this build has no CUDA";
  return nullptr;
}

std::vector<std::string> cuda_peer_check(int64_t, std::string* note) {
  if (note) *note = "this build has no CUDA";
  return {};
}

#endif

}  // namespace cz::dist
