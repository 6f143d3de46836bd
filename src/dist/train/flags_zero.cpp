// The distributed and ZeRO entries of the flag table (flags.h): the stage, buckets, prefetch, the mesh,
// quantized communication, offload, the communicators.
#include "dist/train/flags_table.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dist/comm/mesh.h"
#include "dist/train/recipe.h"
#include "dist/train/step_tracer.h"
#include "dist/zero/schedule.h"
#include "tensor/check.h"

namespace cz::train {

std::vector<Flag> zero_flags() {
  using C = const TrainConfig&;
  using F = const Flag&;
  using T = TrainConfig;
  return {
      {.name = "--stage",
       .field = &T::stage,
       .group = kZeroGroup,
       .help = "ZeRO stage: 0 replicated, 1 shards optimizer state, 2 also gradients, 3 also parameters",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.stage >= 0 && c.stage <= zero::kMaxStage, "{} must be 0, 1, 2 or 3, got {}", f.name,
                      c.stage);
           },
       .ranks_agree = true,
       .json_key = "stage"},
      {.name = "--bucket-mb",
       .field = &T::bucket_mb,
       .group = kZeroGroup,
       .help = "gradient bucket size in MiB (stages 0-2; at most a quarter of the model)",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.bucket_mb) && c.bucket_mb > 0 && c.bucket_mb <= 1 << 16,
                      "{} must be in (0, 65536], got {}", f.name, c.bucket_mb);
           },
       .ranks_agree = true,
       .json_key = "bucket_mb"},
      {.name = "--prefetch",
       .field = &T::prefetch,
       .group = kZeroGroup,
       .help = "stage 3: how many units ahead to all-gather",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.prefetch >= 0 && c.prefetch <= zero::kMaxPrefetch, "{} must be in [0, {}], got {}",
                      f.name, zero::kMaxPrefetch, c.prefetch);
           },
       .ranks_agree = true},
      {.name = "--shard-group",
       .field = &T::shard_group,
       .group = kZeroGroup,
       .help = "stages 1-3: the ranks the model state is sharded over, replicated across the rest (HSDP): "
               "world, host (each host's ranks) or N (blocks of N consecutive ranks)",
       .check = [](C c, F f) { dist::check_shard_group(c.shard_group, f.name); },
       .ranks_agree = true,
       .json_key = "shard_group"},
      {.name = "--hpz",
       .field = &T::hpz,
       .group = kZeroGroup,
       .help = "stage 3, several hosts: keep each unit's host-local slice after its forward gather, so that "
               "backward gathers inside the host (costs 1/ranks-per-host of the model per rank)",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.hpz || c.stage == 3, "{} is for {} 3, got {} {}", f.name, flag_name(&T::stage),
                      flag_name(&T::stage), c.stage);
             CZ_CHECK(!c.hpz || c.shard_group == "world",
                      "{} shards over the world; with {} {} the shard already stays within its group", f.name,
                      flag_name(&T::shard_group), c.shard_group);
           },
       .ranks_agree = true,
       .json_key = "hpz"},
      {.name = "--reduce-dtype",
       .field = &T::reduce_dtype,
       .group = kZeroGroup,
       .help =
           "fp32 | bf16 | fp16 | int8: the dtype gradients are reduced in. int8 (without --shard-group): "
           "each rank sends the others their chunks of a bucket as blocks of 256 values with an fp32 scale "
           "each, summed in fp32 by the owner (at stage 0 the owner then sends every rank its averaged "
           "chunk the same way)",
       .check =
           [](C c, F f) {
             CZ_CHECK(is_dtype_flag(c.reduce_dtype) || reduces_int8(c),
                      "{} must be fp32, bf16, fp16 or int8, got '{}'", f.name, c.reduce_dtype);
             CZ_CHECK(!reduces_int8(c) || c.shard_group == "world", "{} int8 is for {} world", f.name,
                      flag_name(&T::shard_group));
           },
       .ranks_agree = true,
       .json_key = "reduce_dtype"},
      {.name = "--gather-dtype",
       .field = &T::gather_dtype,
       .group = kZeroGroup,
       .help = "fp32 | bf16 | fp16 | int8: what parameters are all-gathered in (stages 1-3; never wider than "
               "--precision). int8: blocks of 256 values with an fp32 scale each, quantized once per step "
               "from the fp32 master",
       .check =
           [](C c, F f) {
             CZ_CHECK(is_dtype_flag(c.gather_dtype) || c.gather_dtype == "int8",
                      "{} must be fp32, bf16, fp16 or int8, got '{}'", f.name, c.gather_dtype);
             // At stage 0 nothing is gathered: only the compute dtype itself is no conversion (on the CPU,
             // fp32 whatever --precision says).
             CZ_CHECK(c.stage > 0 || c.gather_dtype == "fp32" ||
                          (c.gather_dtype == c.precision && c.device.rfind("cuda", 0) == 0),
                      "{} {} is for {} 1-3 (stage 0 gathers no parameters)", f.name, c.gather_dtype,
                      flag_name(&T::stage));
           },
       .ranks_agree = true,
       .json_key = "gather_dtype"},
      {.name = "--offload-optimizer",
       .field = &T::offload_optimizer,
       .group = kZeroGroup,
       .help = "at any --stage: fp32 master weights, gradients and optimizer state in pinned host memory, "
               "updated by the CPU bucket by bucket as gradients arrive",
       .ranks_agree = true,
       .json_key = "offload_optimizer"},
      {.name = "--offload-overlap-step",
       .field = &T::offload_overlap_step,
       .group = kZeroGroup,
       .help = "with --offload-optimizer: run step t's CPU update during step t+1 (one step stale)",
       .check =
           [](C c, F f) {
             CZ_CHECK(!c.offload_overlap_step || c.offload_optimizer, "{} needs {}", f.name,
                      flag_name(&T::offload_optimizer));
           },
       .ranks_agree = true},
      {.name = "--comm-timeout",
       .field = &T::comm_timeout_s,
       .group = kZeroGroup,
       .help = "seconds a collective may take before the run fails, naming it, the rank it waited for, the "
               "ranks that never reached it and what each last did",
       .check =
           [](C c, F f) {
             CZ_CHECK(std::isfinite(c.comm_timeout_s) && c.comm_timeout_s > 0, "{} must be positive, got {}",
                      f.name, c.comm_timeout_s);
           }},
      {.name = "--comm-impl",
       .field = &T::comm_impl,
       .group = kZeroGroup,
       .help =
           "flat | hier | auto: the world's collectives as one ring, in two levels (inside each host, then "
           "across hosts), or per call whichever the topology's cost model predicts faster (on one host: "
           "the ring)",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.comm_impl == "flat" || c.comm_impl == "hier" || c.comm_impl == "auto",
                      "{} must be flat, hier or auto, got '{}'", f.name, c.comm_impl);
           },
       .ranks_agree = true},
      {.name = "--comm-backend",
       .field = &T::comm_backend,
       .group = kZeroGroup,
       .help =
           "nccl | mpi | auto: what moves the collectives of CUDA ranks: NCCL, or MPI through pinned host "
           "memory (slower; works with several ranks on one GPU and where NCCL hangs); auto: NCCL when every "
           "rank has a GPU of its own, else MPI. CPU ranks always use MPI. At 1 rank, naming one runs the "
           "collectives' code paths over a communicator of one",
       .check =
           [](C c, F f) {
             CZ_CHECK(c.comm_backend == "nccl" || c.comm_backend == "mpi" || c.comm_backend == "auto",
                      "{} must be nccl, mpi or auto, got '{}'", f.name, c.comm_backend);
             CZ_CHECK(c.comm_backend != "nccl" || c.device.rfind("cuda", 0) == 0,
                      "{} nccl needs {} cuda (NCCL moves GPU buffers; CPU ranks use mpi)", f.name,
                      flag_name(&T::device));
           },
       .ranks_agree = true},
  };
}

}  // namespace cz::train
