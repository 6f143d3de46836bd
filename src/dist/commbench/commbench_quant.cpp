// commbench -o quant_all_gather: an all-gather of f32 values sent as block-quantized INT8 (Note [Quantized
// blocks]; INT4 with --quant-bits 4, Note [INT4 blocks]) through the unchanged communicator, next to the
// plain f32 all-gather of the same values. Each rank quantizes its shard into one record (codes, then
// scales), the records travel as bytes in an all-gather of equal-sized records (every record is padded to the
// largest shard's size), and every rank dequantizes all of them into the f32 output. Reported: bytes on the
// wire, the f32 and the quantized times, and the quantized path's effective bandwidth (f32 bytes delivered
// per second, with nccl-tests' all-gather factor).
#include <chrono>
#include <cmath>
#include <cstring>
#include <ostream>
#include <thread>
#include <vector>

#include "dist/comm/bootstrap.h"
#include "dist/comm/communicator.h"
#include "dist/comm/quant.h"
#include "dist/commbench/commbench.h"
#include "tensor/check.h"
#include "tensor/parallel.h"

namespace cz::dist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Element i of the gathered buffer (the same on every rank, so each can check every shard): values in
// [-1, 1] times a magnitude that changes every 5000 elements over six orders, so blocks have different
// scales.
float input_value(int64_t i) {
  const double mag = std::pow(10.0, -double((i / 5000) % 7));
  return float(double(int64_t((uint64_t(i) * 2654435761u) % 2001) - 1000) / 1000.0 * mag);
}

struct Shards {
  int n = 1;
  int64_t count = 0, block = 256;
  int bits = 8;
  int64_t len(int r) const { return shard_count(count, n, r); }
  int64_t off(int r) const { return shard_offset(count, n, r); }
  int64_t record_bytes() const {  // rank 0's shard is the largest
    return bits == 8 ? quant_packed_bytes(len(0), block) : quant4_packed_bytes(len(0), block);
  }
};

// Quantizes a shard into its record (codes at 0, scales after them at a 4-byte boundary).
void pack(const float* x, int64_t len, const Shards& sh, char* record) {
  if (sh.bits == 8) {
    quantize(DType::f32, x, len, sh.block, reinterpret_cast<int8_t*>(record),
             reinterpret_cast<float*>(record + quant_scales_offset(len)));
  } else {
    quantize_int4(DType::f32, x, len, sh.block, reinterpret_cast<uint8_t*>(record),
                  reinterpret_cast<float*>(record + quant_scales_offset(quant4_code_bytes(len))));
  }
}
void unpack(const char* record, int64_t len, const Shards& sh, float* out) {
  if (sh.bits == 8) {
    dequantize(reinterpret_cast<const int8_t*>(record),
               reinterpret_cast<const float*>(record + quant_scales_offset(len)), len, sh.block, DType::f32,
               out);
  } else {
    dequantize_int4(reinterpret_cast<const uint8_t*>(record),
                    reinterpret_cast<const float*>(record + quant_scales_offset(quant4_code_bytes(len))), len,
                    sh.block, DType::f32, out);
  }
}

struct Result {
  double f32_s = 0, comm_s = 0, total_s = 0;
  int64_t wrong = 0;
};

Result run_size(World& world, const CommBenchOptions& o, Communicator& comm, Communicator& ctl,
                int64_t count) {
  const int me = world.rank();
  const Shards sh{world.size(), count, o.quant_block, o.quant_bits};
  const int64_t rb = sh.record_bytes();
  std::vector<float> mine(static_cast<size_t>(sh.len(me))), full(static_cast<size_t>(count));
  for (int64_t i = 0; i < sh.len(me); ++i) mine[size_t(i)] = input_value(sh.off(me) + i);
  std::vector<char> records(static_cast<size_t>(rb * sh.n));
  char* own = records.data() + rb * me;
  Result res;

  // f32: the communicator's all-gather of the shards, one call at a time (as the quantized path must be).
  auto f32_once = [&] {
    comm.all_gather(mine.data(), full.data(), count, DType::f32, Device::cpu())->synchronize();
  };
  // int8: quantize our shard into our slot of the record buffer (in place), gather the records, dequantize.
  auto quant_once = [&](double& comm_s) {
    pack(mine.data(), sh.len(me), sh, own);
    const auto t = Clock::now();
    comm.all_gather(own, records.data(), rb * sh.n, DType::u8, Device::cpu())->synchronize();
    comm_s += seconds_since(t);
    for (int r = 0; r < sh.n; ++r) unpack(records.data() + rb * r, sh.len(r), sh, full.data() + sh.off(r));
  };
  double unused = 0;
  for (int i = 0; i < o.warmup; ++i) f32_once(), quant_once(unused);
  const int iters = std::max(1, o.iters);
  ctl.barrier()->wait();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) f32_once();
  res.f32_s = seconds_since(t0) / iters;
  ctl.barrier()->wait();
  t0 = Clock::now();
  for (int i = 0; i < iters; ++i) quant_once(res.comm_s);
  res.total_s = seconds_since(t0) / iters;
  res.comm_s /= iters;

  if (o.check) {  // every element: the owner's round trip, bit for bit, within half a scale of the input
    std::fill(full.begin(), full.end(), -1000.f);
    quant_once(unused);
    for (int r = 0; r < sh.n; ++r) {
      std::vector<float> x(static_cast<size_t>(sh.len(r))), y(x.size());
      std::vector<char> record(static_cast<size_t>(rb));
      for (int64_t i = 0; i < sh.len(r); ++i) x[size_t(i)] = input_value(sh.off(r) + i);
      pack(x.data(), sh.len(r), sh, record.data());
      unpack(record.data(), sh.len(r), sh, y.data());
      const int64_t codes = sh.bits == 8 ? sh.len(r) : quant4_code_bytes(sh.len(r));
      const auto* s = reinterpret_cast<const float*>(record.data() + quant_scales_offset(codes));
      for (int64_t i = 0; i < sh.len(r); ++i) {
        const float got = full[size_t(sh.off(r) + i)], bound = s[i / sh.block] * (0.5f + 0x1p-15f);
        if (std::memcmp(&got, &y[size_t(i)], 4) != 0 || !(std::fabs(got - x[size_t(i)]) <= bound))
          ++res.wrong;
      }
    }
  }
  double stats[4] = {res.f32_s, res.comm_s, res.total_s, double(res.wrong)};
  ctl.all_reduce(stats, stats, 4, DType::f64, Device::cpu(), ReduceOp::sum)->wait();
  res.f32_s = stats[0] / sh.n;
  res.comm_s = stats[1] / sh.n;
  res.total_s = stats[2] / sh.n;
  res.wrong = int64_t(stats[3]);
  return res;
}

}  // namespace

QuantBenchComms quant_bench_setup(World& world, const CommBenchOptions& o, const char* op) {
  CZ_CHECK(o.device == "cpu", "commbench: -o {} runs on CPU buffers (the CUDA kernels are unrun), not {}", op,
           o.device);
  CZ_CHECK(o.dtype == DType::f32, "commbench: -o {} takes float values, not {}", op,
           bench_dtype_name(o.dtype));
  check_quant_block(o.quant_block);
  CZ_CHECK(o.min_bytes > 0 && o.max_bytes >= o.min_bytes, "commbench: need 0 < -b ({}) <= -e ({})",
           o.min_bytes, o.max_bytes);
  CZ_CHECK(o.step_factor > 1 || o.step_bytes > 0, "commbench: need -f > 1 or -i > 0");
  QuantBenchComms c;
  c.options.backend = o.backend.empty() ? Backend::mpi : parse_backend(o.backend);
  c.options.algorithm = o.impl;
  c.options.timeout_s = o.timeout_s;
  c.options.slice_bytes = o.slice_bytes;
  c.comm = make_communicator(world, c.options);
  CommOptions cc;
  cc.timeout_s = o.timeout_s;
  c.ctl = make_communicator(world, cc);
  return c;
}

int run_quant_bench(World& world, const CommBenchOptions& o, std::ostream& out) {
  CZ_CHECK(o.quant_bits == 8 || o.quant_bits == 4, "commbench: --quant-bits takes 8 or 4, not {}",
           o.quant_bits);
  QuantBenchComms c = quant_bench_setup(world, o, "quant_all_gather");
  const CommOptions& co = c.options;
  Communicator *comm = c.comm.get(), *ctl = c.ctl.get();
  const int n = world.size();
  const bool root_prints = world.rank() == 0;
  const double factor = busbw_factor(Collective::all_gather, n);
  if (root_prints) {
    out << fmt::format(
        "# commbench quant_all_gather: impl {}, backend {}, device cpu, {} ranks ({} cores; rank 0 may use "
        "{}), "
        "B {} (int{} codes + one f32 scale per block), warmup iters: {} iters: {} validation: {}\n",
        name(o.impl), name(co.backend), n, std::thread::hardware_concurrency(), available_cores(),
        o.quant_block, o.quant_bits, o.warmup, o.iters, o.check ? 1 : 0);
    out << "# size: the f32 buffer gathered; wire: the quantized all-gather's buffer (records of codes + "
           "scales);\n"
           "# int8 total = quantize own shard + all-gather of the records + dequantize all; effective "
           "bandwidth: "
           "f32 bytes / total\n#\n";
    out << "#       size         count        wire  wire/f32 |  f32 time   algbw   busbw |  int8 comm   total"
           "  eff.algbw eff.busbw  speedup #wrong\n";
    out << "#        (B)    (elements)         (B)           |      (us)  (GB/s)  (GB/s) |       (us)    (us)"
           "     (GB/s)    (GB/s)                \n";
    out.flush();
  }
  int64_t total_wrong = 0;
  for (double b = double(o.min_bytes); b <= double(o.max_bytes) + 0.5;
       b = o.step_factor > 1 ? b * o.step_factor : b + double(o.step_bytes)) {
    const int64_t count = int64_t(b) / 4;
    if (count == 0) continue;
    const Result r = run_size(world, o, *comm, *ctl, count);
    total_wrong += r.wrong;
    if (!root_prints) continue;
    const double bytes = double(count) * 4;
    const double wire = double(Shards{n, count, o.quant_block, o.quant_bits}.record_bytes() * n);
    const double f32_algbw = bytes / r.f32_s / 1e9, eff_algbw = bytes / r.total_s / 1e9;
    out << fmt::format(
        "{:>12}  {:>12}  {:>10}  {:>8.4f} | {:>9.1f}  {:>6.2f}  {:>6.2f} | {:>10.1f}  {:>6.1f}  {:>9.2f} "
        "{:>9.2f}  {:>6.2f}x  {:>5}\n",
        int64_t(bytes), count, int64_t(wire), wire / bytes, r.f32_s * 1e6, f32_algbw, f32_algbw * factor,
        r.comm_s * 1e6, r.total_s * 1e6, eff_algbw, eff_algbw * factor, r.f32_s / r.total_s, r.wrong);
    out.flush();
  }
  if (root_prints)
    out << fmt::format("# Out of bounds values : {} {}\n#\n", total_wrong, total_wrong ? "FAILED" : "OK");
  return total_wrong ? 1 : 0;
}

}  // namespace cz::dist
