// The memory planner behind `convnext_zero --plan` (docs/planning.md): per rank, from the training flags,
// the world size and the device, the bytes of each kind of memory at the step's peak, their total (what the
// device's caching allocator will report as its peak), whether that fits a given memory size, and the
// largest micro-batch that fits at each ZeRO stage with and without activation checkpointing and CPU offload.
// Answers for any model without building it or touching a device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/comm/topology.h"
#include "dist/plan/run_spec.h"
#include "dist/plan/step_replay.h"

namespace cz::plan {

// Note [The device a plan is for]: a run's --device defaults to cpu. But `--plan --gpu-mem 24GB` asks about
// GPU memory, and `--plan --what-if` on a topology whose ranks sit on GPUs asks about a GPU machine: planned
// for the CPU backend, they would leave out the CUDA context, the cuBLAS and cuDNN workspaces and the
// driver's pages (ConvNeXt-T at 224 px, micro-batch 64, one rank of the 8-GPU test topology: 7.17 GiB
// planned where a CUDA plan needs 7.90 GiB), quietly. So without
// --device such a plan is a CUDA plan; --device, when given, always wins (--device cpu plans CPU ranks
// against
// --gpu-mem); and every plan says which device it is for and why.
// Order: --device given, then the what-if topology's ranks (on GPUs: cuda; CPU processes: cpu), then
// --gpu-mem, then the default.
struct PlanDevice {
  std::string device;  // "cpu" or "cuda[:N]", for the run's --device
  std::string reason;  // why, naming the flags: "--gpu-mem asks about GPU memory and no --device was given"
};
// device_flag: the --device value when the command gave one; what_if: the --what-if topology, if any.
PlanDevice plan_device(const std::optional<std::string>& device_flag, bool gpu_mem,
                       const dist::Topology* what_if);
// Whether any rank of the topology sits on a node of type "gpu" (CPU ranks sit on "proc" nodes).
bool has_gpu_ranks(const dist::Topology& topology);

struct PlanRequest {
  // The run: model, image size, micro-batch, precision, ZeRO config, ... (plan_request in
  // train/plan_request.h makes the request from the training flags).
  RunSpec run;
  std::string device_reason;  // why run.device (PlanDevice::reason), shown with the plan; "" says nothing
  int world = 1;              // ranks
  // Ranks per host, for --shard-group host, --hpz (Note [2-D mesh]) and two-level collectives (--comm-impl
  // hier or auto, Note [Two-level collectives]); 0: all ranks on one host.
  int ranks_per_host = 0;
  // The run's topology (dist::detect_topology, or a topology file), for --comm-impl auto across hosts: each
  // of the world's collectives is planned on the algorithm the communicator's cost model will pick for it
  // (dist::takes_two_levels). Without one, the topology of CPU ranks on hosts of ranks_per_host with the
  // detector's default link speeds (dist::DetectOptions).
  std::optional<dist::Topology> topology;
  std::optional<int64_t> gpu_mem;  // bytes of device memory to fit in (--gpu-mem)
  bool max_micro_batch = true;     // search the largest micro-batch per stage (needs gpu_mem)
  // Whose share of a checkpoint's host copy is planned (with run.checkpoint_dir): rank 0's, the largest
  // (it writes the replicated state at stage 0, and the partitions' padding falls on the last ranks).
  int rank = 0;
  // The run as it went, where known (plan_request_for_run, train/plan_request.h: the closing summary): its
  // first and last step. 0: unknown, as for `--plan` (the last step is then --steps when given), which plans,
  // with
  // --checkpoint-every, a save in flight. Note [What a run holds that a step does not decide].
  int64_t first_step = 1, last_step = 0;
};

// Note [What a run holds that a step does not decide]: two rows of the plan depend on the run around the
// step, not on the step. (1) A background save's host copy lives from the save until the first step
// boundary after its writer finished, so it is in a step's peak only when a step runs after a periodic save:
// --checkpoint-every N with a multiple of N before the last step, without --checkpoint-sync (which finishes
// the save before the next step). The save that every run with --checkpoint-dir makes at its end comes after
// its last step, and a stop's final save too (measured: 1 process planned 179.5 MiB, 134.5 used, with
// --checkpoint-dir alone). (2) The loader's workers hold threads x 2 batches beyond the step's own, at an
// epoch's end too: they run ahead into the next epoch (Note [Running ahead] in io/data/loader.h), so the plan
// holds the whole window there, not min(window, batches left in the epoch).

struct PlanRow {
  std::string key;    // JSON key without the "_bytes" suffix, e.g. "optimizer_state", "activations_stages_0"
  std::string label;  // for the table
  int64_t bytes = 0;
};

struct MaxMicroBatch {
  int stage = 0;
  bool checkpointing = false;
  bool offload = false;     // --offload-optimizer
  int64_t micro_batch = 0;  // 0: not even one image fits
};

struct Plan {
  std::string model;
  int64_t num_params = 0;  // as registered
  int64_t psi = 0;         // Ψ: after alignment and partition padding (Note [ZeRO memory model])
  int world = 1, stage = 0;
  std::string device, precision;
  std::string device_reason;  // PlanRequest::device_reason
  int64_t image_size = 0, micro_batch = 0;
  bool checkpointing = false;
  bool offload = false;

  // At the step's peak, summing to total_bytes: model state, the batch, activations saved for backward by
  // network part (those still alive then), backward temporaries, kernel workspaces, and the allocator's
  // size-class rounding of all of them.
  std::vector<PlanRow> rows;
  int64_t total_bytes = 0;  // the planned peak of the allocator (StepStats::peak_mem_bytes)
  // --offload-optimizer, and on CUDA a background checkpoint's host copy: what lives in pinned host memory
  // (not in total_bytes), by row.
  std::vector<PlanRow> host_rows;
  int64_t host_bytes = 0;
  std::string peak_at;                                               // the op running at the peak
  std::vector<std::pair<std::string, int64_t>> largest_temporaries;  // backward temporaries live at the peak
  // Everything saved for backward when forward ends, by network part, without and with activation
  // checkpointing (whichever the flags ask for, and the other).
  std::vector<PlanRow> saved_end_of_forward[2];

  int64_t fragmentation_bytes = 0;    // CUDA: the driver backs each large block with whole 2 MiB pages
  int64_t device_overhead_bytes = 0;  // CUDA context and NCCL buffers outside the allocator (allowances)
  int64_t required_bytes = 0;         // total + fragmentation + device overhead: what must fit
  int64_t reserved_bytes = 0;         // the allocator's cache at its fullest (it empties it before failing)
  std::optional<int64_t> gpu_mem;
  std::optional<bool> fits;
  // Stages 0-3 x offload off/on x checkpointing off/on, when gpu_mem is given.
  std::vector<MaxMicroBatch> max_micro_batch;
};

Plan make_plan(const PlanRequest& request);
// The step replay make_plan's figures come from, with its event log (StepReplay::events): what
// tests/dist/plan/test_step_events.cpp holds the real step's allocator log to, op by op.
StepReplay plan_step_replay(const PlanRequest& request);
std::string format_plan(const Plan& plan);
// A CUDA plan row checked on a GPU: a run of this model, image size, micro-batch, world, stage and precision
// had its plan equal its measured peak within 1% (tests/dist/plan/run_cuda_plan_rows.sh, a `cuda` test per
// row).
struct CheckedCudaRow {
  std::string model;  // Plan::model ("convnext_tiny")
  int64_t image_size = 0, micro_batch = 0;
  int world = 1, stage = 0;
  std::string precision;
  std::string checked_on;  // the GPU and the day, for the record
};
// The rows checked so far (planner.cpp): none yet, so every CUDA summary still says the plan is unchecked.
// A GPU run that passes a row's test adds it here.
const std::vector<CheckedCudaRow>& checked_cuda_rows();

// Why a run's measured peak differs from its plan, for the closing summary: "" when they are equal; on
// several ranks, planned high by no more than the ring scratch, the communicators' threads growing it at
// times of their own (docs/planning.md, Measured against planned); on CUDA, unless the run's row is among
// `checked`, that the plan is not yet checked against a GPU; otherwise by how much and that it is not
// expected.
std::string plan_difference(const Plan& plan, int64_t measured_bytes);
std::string plan_difference(const Plan& plan, int64_t measured_bytes,
                            const std::vector<CheckedCudaRow>& checked);
nlohmann::json plan_to_json(const Plan& plan);

// "24GB" (10^9), "24GiB" (2^30), "512MB", "512MiB", "1.5TB", "4096" (bytes); units are case-insensitive.
// Throws ValueError naming `flag` for a size of 0, a negative or malformed number, or an unknown unit.
int64_t parse_memory_size(const std::string& text, const std::string& flag = "--gpu-mem");

// The world size and this process's rank as a launcher announces them (Open MPI, PMI, PMIx, MVAPICH,
// Slurm), without starting MPI; 1 and 0 outside any launcher.
int launcher_world_size();
int launcher_rank();
// The ranks the launcher started on this rank's host (Open MPI's local size; $CZ_SIMULATE_HOSTS first, as
// the trainer counts hosts); 0 when it does not say.
int launcher_ranks_per_host();

}  // namespace cz::plan
