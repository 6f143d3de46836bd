// The logic behind apps/commbench: nccl-tests-style collective benchmarks (same columns, same bus bandwidth
// factors, correctness check, per-iteration spread over ranks), OSU-style point-to-point matrices and a
// pairwise pattern check (--op sendrecv, --check-p2p), a host<->device copy benchmark like CUDA's
// bandwidthTest, and the topology views (--show-topology, --topo-file FILE --show-ring).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/comm/communicator.h"
#include "dist/comm/types.h"
#include "tensor/device.h"

namespace cz::dist {

class World;

struct CommBenchOptions {
  std::string op = "all_reduce";  // all_reduce | reduce_scatter | all_gather | broadcast | sendrecv | copy
  int64_t min_bytes = 32 << 20;   // -b
  int64_t max_bytes = 32 << 20;   // -e
  double step_factor = 1;         // -f: sizes multiply by this when > 1 ...
  int64_t step_bytes = 1 << 20;   // -i: ... and grow by this otherwise
  int iters = 20;                 // -n
  int warmup = 5;                 // -w
  int check = 1;                  // -c: validate results (0: no)
  Algorithm impl = Algorithm::builtin;
  std::string backend;  // "" picks nccl for CUDA buffers, mpi for CPU ones
  std::string device = "cpu";
  DType dtype = DType::f32;
  ReduceOp redop = ReduceOp::sum;
  int root = 0;
  double timeout_s = 300;     // --comm-timeout: per collective
  double size_timeout_s = 0;  // --timeout: per size, all its iterations and its check (0: none)
  int average = 1;            // -a: the time column over ranks: 0 rank 0, 1 mean, 2 min, 3 max (nccl-tests)
  bool per_rank = false;      // --per-rank: every rank's figures under each row of the table
  bool check_p2p = false;     // --check-p2p: known patterns between every pair (commbench_p2p.cpp)
  int window = 64;            // --window: sendrecv's back-to-back sends per bandwidth iteration (osu_bw)
  int64_t slice_bytes = 0;
  bool json = false;
  std::string memory = "both";  // copy mode: pinned | pageable | both
  std::string topo_file;
  bool show_ring = false;
  bool show_topology = false;
  // -o quant_all_gather (commbench_quant.cpp): values per f32 scale (Note [Quantized blocks]).
  int64_t quant_block = 256;
  int quant_bits = 8;  // 8 or 4 (Note [INT4 blocks])
};

// Note [Time spread]: besides nccl-tests' time (the -n iterations issued back to back, the elapsed time over
// -n), each rank times -n more iterations one at a time (issue, then wait for the result) and keeps their
// minimum, median, 99th percentile and maximum (nearest rank: the ceil(p/100 * n)-th smallest, so with
// fewer than 100 iterations p99 is the maximum). Over ranks: min_us the smallest rank's min, max_us the
// largest rank's max, p50_us and p99_us the ranks' figures aggregated as -a aggregates the time (mean by
// default); the JSON has every rank's figures too.
struct TimeSpread {
  double min_us = 0, p50_us = 0, p99_us = 0, max_us = 0;
};
TimeSpread time_spread(std::vector<double> times_us);
// -a's aggregation of one figure per rank: 0 rank 0's, 1 the mean, 2 the minimum, 3 the maximum.
double aggregate_over_ranks(const std::vector<double>& per_rank, int average);

// "32M", "1G", "4096", "64K" (powers of 1024, as nccl-tests reads them).
int64_t parse_size(const std::string& s);
// nccl-tests' names: float, double, half, bfloat16 (f32, f64, f16, bf16 accepted too).
DType parse_bench_dtype(const std::string& s);
std::string bench_dtype_name(DType dtype);

// Runs what the options ask for; rank 0 prints to `out`. Returns the exit code (1 when results were wrong).
int run_commbench(World& world, const CommBenchOptions& options, std::ostream& out);
// --show-ring on a topology file: the ring and its predicted bus bandwidth against rank order (no MPI used).
void print_ring_report(const class Topology& topology, std::ostream& out);
// --op sendrecv: bandwidth (osu_bw) and latency (osu_latency) between every ordered pair of ranks, and on
// CUDA the devices' peer copy matrix (p2pBandwidthLatencyTest); --check-p2p. In commbench_p2p.cpp.
int run_p2p_bench(World& world, const CommBenchOptions& options, std::ostream& out);
int run_p2p_check(World& world, const CommBenchOptions& options, std::ostream& out);
// What commbench's JSON says about the machine (commbench_machine.cpp): host, CPU, driver, CUDA, NCCL and MPI
// versions, every rank's host and the detected topology. Collective (the topology is gathered).
nlohmann::ordered_json machine_facts(World& world);
// The copy benchmark (-o copy), in commbench_copy.cpp.
int run_copy_bench(World& world, const CommBenchOptions& options, std::ostream& out);
// The block-quantized INT8 all-gather against the f32 one (-o quant_all_gather), in commbench_quant.cpp.
int run_quant_bench(World& world, const CommBenchOptions& options, std::ostream& out);
// What both quantized benchmarks check and open (commbench_quant.cpp): CPU float buffers, a valid block and
// size range; the communicator measured (--impl, --backend, --slice) and a control one for barriers and the
// results.
struct QuantBenchComms {
  std::unique_ptr<Communicator> comm, ctl;
  CommOptions options;  // comm's
};
QuantBenchComms quant_bench_setup(World& world, const CommBenchOptions& options, const char* op);
// The engine's quantized reduce-scatter against the f32 one (-o quant_reduce_scatter), in
// commbench_quant_rs.cpp.
int run_quant_reduce_scatter_bench(World& world, const CommBenchOptions& options, std::ostream& out);

}  // namespace cz::dist
