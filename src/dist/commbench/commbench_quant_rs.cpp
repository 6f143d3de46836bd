// commbench -o quant_reduce_scatter: the engine's quantized reduce-scatter of a gradient bucket
// (--reduce-dtype int8; zero::QuantizedReduceScatter, Note [Quantized reduction]: an all-to-all of INT8
// records, each chunk summed in fp32 by its owner) next to the f32 reduce-scatter of the same buffer on the
// communicator (--impl). Reported: bytes each rank sends, the f32 and the quantized times, and the quantized
// path's effective bandwidth (f32 bytes reduced per second, with nccl-tests' reduce-scatter factor). With
// --impl hier the quantized side is the two-hop reduction (zero::TwoHopQuantizedReduceScatter, Note [Two-hop
// quantized reduction]) over the mesh's host and cross groups, and the f32 side the two-level reduce-scatter.
#include <chrono>
#include <cmath>
#include <memory>
#include <ostream>
#include <thread>
#include <vector>

#include "dist/comm/bootstrap.h"
#include "dist/comm/mesh.h"
#include "dist/comm/process_group.h"
#include "dist/comm/quant.h"
#include "dist/commbench/commbench.h"
#include "dist/zero/comm_meter.h"
#include "dist/zero/quant_reduce.h"
#include "dist/zero/quant_reduce_hier.h"
#include "tensor/check.h"
#include "tensor/tensor.h"

namespace cz::dist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Element i of rank r's bucket, known to every rank (so each can check its chunk): values in [-1, 1] times a
// magnitude that changes every 3000 elements over five orders, different on every rank.
float bucket_value(int r, int64_t i) {
  const double mag = std::pow(10.0, -double((i / 3000 + r) % 5));
  return float(double(int64_t((uint64_t(i) * 2654435761u + uint64_t(r) * 40503u) % 2001) - 1000) / 1000.0 *
               mag);
}

struct Result {
  double f32_s = 0, total_s = 0;
  int64_t wrong = 0;
};

// `mesh`: the two-hop reduction's groups (--impl hier), or null for the flat all-to-all.
Result run_size(World& world, const CommBenchOptions& o, Communicator& comm, Communicator& ctl,
                const Mesh* mesh, int64_t chunk) {
  const int n = world.size(), me = world.rank();
  const int64_t count = chunk * n;
  const ProcessGroup group(&comm, Device::cpu());
  zero::CommMeter meter;
  Tensor bucket = empty({count}, DType::f32), out = empty({chunk}, DType::f32);
  auto fill = [&] {
    float* b = bucket.data<float>();
    for (int64_t i = 0; i < count; ++i) b[i] = bucket_value(me, i);
  };
  auto f32_once = [&] {
    comm.reduce_scatter(bucket.raw_data(), out.raw_data(), count, DType::f32, Device::cpu(), ReduceOp::sum)
        ->synchronize();
  };
  auto quant_once = [&] {
    if (mesh) {
      zero::TwoHopQuantizedReduceScatter q(mesh->world(), mesh->host(), mesh->cross(), mesh->hosts(), bucket,
                                           chunk, o.quant_block, meter);
      q.finish(1.0);
    } else {
      zero::QuantizedReduceScatter q(group, bucket, chunk, o.quant_block, meter);
      q.finish(1.0);
    }
  };
  Result res;
  fill();
  for (int i = 0; i < o.warmup; ++i) f32_once(), quant_once(), fill();
  const int iters = std::max(1, o.iters);
  ctl.barrier()->wait();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) f32_once();
  res.f32_s = seconds_since(t0) / iters;
  // The quantized reduction writes our chunk of the bucket in place: refilled between iterations, untimed.
  double quant_s = 0;
  for (int i = 0; i < iters; ++i) {
    fill();
    ctl.barrier()->wait();
    t0 = Clock::now();
    quant_once();
    quant_s += seconds_since(t0);
  }
  res.total_s = quant_s / iters;

  // Within the N - 1 senders' half scales (and f32 summation) of the exact sum; two hops add half a scale of
  // each other host's partial sum, whose block peak is at most the sum of its ranks' peaks: each rank off
  // this host counts its half scale once more (a bound, not the value).
  if (o.check) {
    fill();
    quant_once();
    const float* got = bucket.data<float>() + me * chunk;
    std::vector<double> exact(static_cast<size_t>(chunk), 0.0), bound(static_cast<size_t>(chunk), 0.0);
    std::vector<float> x(static_cast<size_t>(chunk));
    std::vector<int8_t> q(static_cast<size_t>(chunk));
    std::vector<float> scales(size_t((chunk + o.quant_block - 1) / o.quant_block));
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < chunk; ++i) x[size_t(i)] = bucket_value(r, me * chunk + i);
      if (r != me) quantize(DType::f32, x.data(), chunk, o.quant_block, q.data(), scales.data());
      for (int64_t i = 0; i < chunk; ++i) {
        exact[size_t(i)] += x[size_t(i)];
        const double half = double(scales[size_t(i / o.quant_block)]) * (0.5 + 0x1p-15);
        const bool off_host = mesh && mesh->hosts().host_of[size_t(r)] != mesh->hosts().host_of[size_t(me)];
        bound[size_t(i)] += std::fabs(x[size_t(i)]) * 1e-6 + (r == me ? 0.0 : half) + (off_host ? half : 0.0);
      }
    }
    for (int64_t i = 0; i < chunk; ++i)
      if (!(std::fabs(double(got[i]) - exact[size_t(i)]) <= bound[size_t(i)])) ++res.wrong;
  }
  double stats[3] = {res.f32_s, res.total_s, double(res.wrong)};
  ctl.all_reduce(stats, stats, 3, DType::f64, Device::cpu(), ReduceOp::sum)->wait();
  res.f32_s = stats[0] / n;
  res.total_s = stats[1] / n;
  res.wrong = int64_t(stats[2]);
  return res;
}

}  // namespace

int run_quant_reduce_scatter_bench(World& world, const CommBenchOptions& o, std::ostream& out) {
  CZ_CHECK(o.quant_bits == 8,
           "commbench: -o quant_reduce_scatter sends INT8 records (--quant-bits 8), not {}", o.quant_bits);
  QuantBenchComms c = quant_bench_setup(world, o, "quant_reduce_scatter");
  const CommOptions& co = c.options;
  Communicator *comm = c.comm.get(), *ctl = c.ctl.get();
  const int n = world.size();
  const bool root_prints = world.rank() == 0;
  const double factor = busbw_factor(Collective::reduce_scatter, n);
  std::unique_ptr<Mesh> mesh;
  if (o.impl == Algorithm::hier) {
    CommOptions ring = co;
    ring.algorithm = Algorithm::ring;
    mesh = std::make_unique<Mesh>(world, ring, "world", /*host_levels=*/true);
    CZ_CHECK(
        zero::two_hop_applies(mesh->world(), mesh->hosts()),
        "commbench: -o quant_reduce_scatter --impl hier needs several hosts with the same number (> 1) of "
        "ranks each; this launch has {} ranks on {} hosts",
        n, mesh->hosts().num_hosts());
  }
  const int hosts = mesh ? mesh->hosts().num_hosts() : 1;
  if (root_prints) {
    out << fmt::format(
        "# commbench quant_reduce_scatter: f32 reduce-scatter impl {}, backend {}, device cpu, {} ranks ({} "
        "cores), B {} (int8 codes + one f32 scale per block), warmup iters: {} iters: {} validation: {}\n",
        name(o.impl), name(co.backend), n, std::thread::hardware_concurrency(), o.quant_block, o.warmup,
        o.iters, o.check ? 1 : 0);
    out << "# size: the f32 buffer reduced (N chunks); sent: bytes each rank sends, f32 (the ring's (N-1)/N) "
           "and "
           "int8 (N-1 records);\n# int8 total = quantize the N-1 chunks + all-to-all of the records + "
           "dequantize-add into our chunk;\n# effective bandwidth: f32 bytes / total\n#\n";
    out << "#       size         count    f32 sent   int8 sent  ratio |  f32 time   algbw   busbw |  int8 "
           "total"
           "  eff.algbw eff.busbw  speedup #wrong\n";
    out << "#        (B)    (elements)         (B)         (B)        |      (us)  (GB/s)  (GB/s) |        "
           "(us)"
           "     (GB/s)    (GB/s)                \n";
    out.flush();
  }
  int64_t total_wrong = 0;
  for (double b = double(o.min_bytes); b <= double(o.max_bytes) + 0.5;
       b = o.step_factor > 1 ? b * o.step_factor : b + double(o.step_bytes)) {
    const int64_t chunk = int64_t(b) / 4 / n;
    if (chunk == 0) continue;
    const Result r = run_size(world, o, *comm, *ctl, mesh.get(), chunk);
    total_wrong += r.wrong;
    if (!root_prints) continue;
    const double bytes = double(chunk * n) * 4;
    // Two hops: (R - 1) H records inside the host, H - 1 across hosts.
    const double records = mesh ? double((n / hosts - 1) * hosts + hosts - 1) : double(n - 1);
    const double f32_sent = bytes * (n - 1) / n,
                 int8_sent = records * double(quant_packed_bytes(chunk, o.quant_block));
    const double f32_algbw = bytes / r.f32_s / 1e9, eff_algbw = bytes / r.total_s / 1e9;
    out << fmt::format(
        "{:>12}  {:>12}  {:>10}  {:>10}  {:>5.3f} | {:>9.1f}  {:>6.2f}  {:>6.2f} | {:>11.1f}  {:>9.2f} "
        "{:>9.2f}  "
        "{:>6.2f}x  {:>5}\n",
        int64_t(bytes), chunk * n, int64_t(f32_sent), int64_t(int8_sent), int8_sent / f32_sent, r.f32_s * 1e6,
        f32_algbw, f32_algbw * factor, r.total_s * 1e6, eff_algbw, eff_algbw * factor, r.f32_s / r.total_s,
        r.wrong);
    out.flush();
  }
  if (root_prints)
    out << fmt::format("# Out of bounds values : {} {}\n#\n", total_wrong, total_wrong ? "FAILED" : "OK");
  return total_wrong ? 1 : 0;
}

}  // namespace cz::dist
