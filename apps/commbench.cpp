// commbench: collective and copy benchmarks in the manner of nccl-tests, and topology views. Flag parsing
// only; the logic is cz::dist::run_commbench (src/dist/comm/commbench.cpp). Run under mpirun for several
// ranks.
#include <CLI/CLI.hpp>

#include <iostream>

#include "dist/comm/bootstrap.h"
#include "dist/commbench/commbench.h"
#include "tensor/parallel.h"

int main(int argc, char** argv) {
  cz::use_passive_omp_waits(argv);  // Note [Passive OpenMP waits]
  using namespace cz::dist;
  CommBenchOptions o;
  std::string min_b = "32M", max_b = "32M", step_b = "1M", impl = "builtin", dtype = "float", redop = "sum";
  std::string slice = "0";
  CLI::App app{"commbench: collective benchmarks (nccl-tests columns), host<->device copies, topology views"};
  app.add_option("-o,--op", o.op,
                 "all_reduce | reduce_scatter | all_gather | broadcast | sendrecv (every pair: osu_bw, "
                 "osu_latency) | copy | quant_all_gather | quant_reduce_scatter")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "sendrecv", "copy",
                             "quant_all_gather", "quant_reduce_scatter"}))
      ->capture_default_str();
  app.add_option("-b,--minbytes", min_b, "smallest size (e.g. 8, 64K, 32M)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_b, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", o.step_factor, "multiply the size by this (when > 1)")
      ->capture_default_str();
  app.add_option("-i,--stepbytes", step_b, "else add this to the size")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "untimed iterations first")->capture_default_str();
  app.add_option("-c,--check", o.check, "check results against a local reference (0: no)")
      ->capture_default_str();
  app.add_option("-d,--datatype", dtype, "float | double | half | bfloat16")
      ->check(CLI::IsMember({"float", "double", "half", "bfloat16", "f32", "f64", "f16", "bf16"}))
      ->capture_default_str();
  app.add_option("--redop", redop, "sum | avg")->check(CLI::IsMember({"sum", "avg"}))->capture_default_str();
  app.add_option("-r,--root", o.root, "broadcast root")->capture_default_str();
  app.add_option("--impl", impl, "ring | builtin | hier (two levels: inside hosts, then across) | auto")
      ->check(CLI::IsMember({"ring", "builtin", "hier", "auto"}))
      ->capture_default_str();
  app.add_option("--backend", o.backend, "mpi | nccl (default: nccl for cuda, mpi for cpu)")
      ->check(CLI::IsMember({"mpi", "nccl"}));
  app.add_option("--device", o.device, "cpu | cuda (buffers' device)")->capture_default_str();
  app.add_option("--comm-timeout", o.timeout_s, "seconds before a collective is declared hung")
      ->capture_default_str();
  app.add_option("-T,--timeout", o.size_timeout_s,
                 "seconds a size may take before the run is aborted (0: none)")
      ->capture_default_str();
  app.add_option("-a,--average", o.average, "time over ranks: 0 rank 0, 1 mean, 2 min, 3 max")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  app.add_flag("--per-rank", o.per_rank, "every rank's time and spread under each row");
  app.add_flag("--check-p2p", o.check_p2p,
               "send known bytes between every pair of ranks (and GPUs) and name the pairs that get others");
  app.add_option("--window", o.window, "sendrecv: back-to-back sends per bandwidth iteration (osu_bw)")
      ->capture_default_str();
  app.add_option("--slice", slice, "ring pipelining slice (0: the backend's default)")->capture_default_str();
  app.add_option("--memory", o.memory, "copy mode: pinned | pageable | both")
      ->check(CLI::IsMember({"pinned", "pageable", "both"}))
      ->capture_default_str();
  app.add_flag("--json", o.json, "print one JSON document instead of the table");
  app.add_option("--topo-file", o.topo_file, "a topology JSON file to analyse instead of this machine");
  app.add_flag("--show-ring", o.show_ring,
               "print the ring order and its predicted bus bandwidth vs rank order");
  app.add_flag("--show-topology", o.show_topology, "print the detected topology as JSON");
  app.add_option("--quant-block", o.quant_block,
                 "quant_all_gather, quant_reduce_scatter: values per f32 scale (multiple of 32, 32..4096)")
      ->capture_default_str();
  app.add_option("--quant-bits", o.quant_bits, "quant_all_gather: 8 or 4 bits per value")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  int rc = 0;
  try {
    World& world = World::init(&argc, &argv);
    try {
      o.min_bytes = parse_size(min_b);
      o.max_bytes = parse_size(max_b);
      o.step_bytes = parse_size(step_b);
      o.slice_bytes = parse_size(slice);
      o.impl = parse_algorithm(impl);
      o.dtype = parse_bench_dtype(dtype);
      o.redop = parse_reduce_op(redop);
      rc = run_commbench(world, o, std::cout);
    } catch (const std::exception& e) {
      die(e);
    }
    World::finalize();
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return rc;
}
