// The logic behind apps/commbench: nccl-tests-style collective benchmarks (same columns, same bus bandwidth
// factors, correctness check), a host<->device copy benchmark like CUDA's bandwidthTest, and the topology
// views (--show-topology, --topo-file FILE --show-ring).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include "dist/comm/communicator.h"
#include "dist/comm/types.h"
#include "tensor/device.h"

namespace cz::dist {

class World;

struct CommBenchOptions {
  std::string op = "all_reduce";  // all_reduce | reduce_scatter | all_gather | broadcast | copy
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
  double timeout_s = 300;
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

// "32M", "1G", "4096", "64K" (powers of 1024, as nccl-tests reads them).
int64_t parse_size(const std::string& s);
// nccl-tests' names: float, double, half, bfloat16 (f32, f64, f16, bf16 accepted too).
DType parse_bench_dtype(const std::string& s);
std::string bench_dtype_name(DType dtype);

// Runs what the options ask for; rank 0 prints to `out`. Returns the exit code (1 when results were wrong).
int run_commbench(World& world, const CommBenchOptions& options, std::ostream& out);
// --show-ring on a topology file: the ring and its predicted bus bandwidth against rank order (no MPI used).
void print_ring_report(const class Topology& topology, std::ostream& out);
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
