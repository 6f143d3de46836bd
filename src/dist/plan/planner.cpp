// The memory planner: flags -> ZeRO model state (zero_memory.h) + one step's allocations (step_replay.h) ->
// the rows of the plan, whether it fits, and the largest micro-batch that does.
#include "dist/plan/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>

#include <fmt/format.h>

#include "dist/comm/hier_communicator.h"
#include "dist/comm/topology_detect.h"
#include "dist/plan/step_replay.h"
#include "dist/plan/zero_memory.h"
#include "dist/zero/step_plan.h"
#include "tensor/check.h"
#include "tensor/device.h"
#include "tensor/omp_wait_policy.h"
#include "tensor/parallel.h"

namespace cz::plan {
namespace {

// Memory a CUDA process holds outside the caching allocator: the context with the cuDNN and cuBLAS
// libraries loaded, and NCCL's channel buffers when there are several ranks. Allowances, not measured here.
constexpr int64_t kCudaContext = int64_t(512) << 20;
constexpr int64_t kNcclBuffers = int64_t(256) << 20;
constexpr int64_t kMaxSearchedBatch = int64_t(1) << 24;

// Everything make_plan derives from the flags once.
struct Setup {
  RunSpec run;
  std::shared_ptr<const nn::ModelSpec> spec;  // the model the step walks
  std::vector<nn::ParamInfo> params;
  DType compute = DType::f32, reduce = DType::f32;
  bool cuda = false;
  int world = 1;
  int rank = 0;
  int shard = 1;          // the shard group's ranks (--shard-group; the world when flat)
  int per_host = 0;       // ranks per host when the world's collectives may take two levels; else 0
  zero::ZeroConfig zero;  // the run's (its stage and offload set per plan row)
  zero::MeshFacts mesh;   // the world, shard group and hosts the step plan reads
  std::function<bool(dist::Collective, int64_t)> two_level;  // which of them do (EngineSpec::two_level)
  // Note [What a run holds that a step does not decide]: the loader's batches beyond the step's own, and
  // whether a background save's host copy is alive during a step.
  int64_t prefetched = 0;
  bool copy_in_flight = false;
  // The steps the run ran where it is known (plan_request_for_run), else 0: a plan (--plan, --what-if, whose
  // requests carry a stand-in --steps) asks --cuda-graphs as for a run long enough to capture.
  int64_t run_steps = 0;
};

// The engine's layout and model state at `stage`, with or without offload.
struct Engine {
  zero::StepPlan plan;
  ZeroSpec spec;
  ZeroState state;
};

Engine engine_at(const Setup& s, int stage, bool offload) {
  Engine e;
  zero::ZeroConfig zc = s.zero;
  zc.stage = stage;
  zc.offload = offload;
  e.plan = zero::make_step_plan(zc, s.mesh);
  ZeroSpec& z = e.spec;
  z.plan = e.plan;
  z.layout = zero_layout(s.params, e.plan);
  z.optimizer_state_tensors = s.run.optimizer_state_tensors;
  z.ema = s.run.ema;
  z.cpu_device = !s.cuda;
  e.state = zero_model_state(z);
  return e;
}

// --checkpoint-dir: the bytes of the host copy a background save makes of rank `s.rank`'s share of the state
// (Trainer::save_checkpoint, checkpoint_save.cpp copy_to_host): its fp32 master weights, optimizer state and
// EMA over the parameters' elements in its chunks (padding is not saved), one buffer for all of them; at
// stage 0 rank 0 saves the replicated state and the others nothing; on a 2-D mesh the first shard group's
// ranks save (the first of each replication group). -1 when no save is in flight during a step.
int64_t checkpoint_copy_bytes(const Setup& s, const Engine& engine) {
  if (!s.copy_in_flight) return -1;
  const zero::ZeroLayout& l = engine.spec.layout;
  if (l.shards == 1 && s.rank != 0) return 0;
  if (s.rank >= l.shards) return 0;  // shard groups are blocks of consecutive ranks
  int64_t elements = 0;
  for (size_t p = 0; p < l.partitions.size(); ++p) {
    const ShardRange r = l.chunk_range(p, l.shards == 1 ? 0 : s.rank);
    for (const FlatSegment& seg : l.flat.segments)
      elements +=
          std::max<int64_t>(0, std::min(r.end, seg.offset + seg.numel) - std::max(r.begin, seg.offset));
  }
  const int64_t groups = 1 + engine.spec.optimizer_state_tensors + (engine.spec.ema ? 1 : 0);
  return elements * groups * 4;
}

StepSpec step_spec(const Setup& s, const Engine& engine, int64_t micro_batch, bool checkpointing) {
  StepSpec sp;
  sp.model = s.spec;
  sp.image_size = s.run.image_size;
  sp.micro_batch = micro_batch;
  sp.grad_accum = s.run.grad_accum;
  sp.compute = s.compute;
  sp.checkpointing = checkpointing;
  sp.cuda = s.cuda;
  // The loader's workers keep threads x prefetch (2) batches ahead, across epochs; on the CPU backend they
  // are in the training device's allocator.
  sp.prefetched_batches = s.cuda ? 0 : s.prefetched;
  sp.soft_targets = s.run.soft_targets;
  if (s.cuda && s.run.cuda_graphs) {
    // Note [CUDA graphs for the step]: the plan asks as auto would (a run with --cuda-graphs on where a
    // capture is unsafe is refused before it starts).
    const std::string comm =
        s.world > 1 || s.run.comm_backend != "auto" ? (s.run.comm_backend == "mpi" ? "mpi" : "nccl") : "";
    const CudaGraphFigures gp = s.run.cuda_graphs(s.run, s.world, comm, s.run_steps);
    sp.graphs = gp.micro_step_graphs;
    sp.device_scalars = gp.capture;
  }
  sp.state = engine.state.buffers;
  // On CUDA the copy is pinned host memory (Plan::host_rows), outside the device's allocator.
  if (!s.cuda) sp.checkpoint_copy_bytes = std::max<int64_t>(0, checkpoint_copy_bytes(s, engine));
  sp.engine.plan = engine.plan;
  sp.engine.units = s.spec->units();
  sp.engine.layout = engine.spec.layout;
  sp.engine.prefetch = s.run.zero.prefetch;
  sp.engine.ranks_per_host = s.per_host;
  sp.engine.rank = s.rank;
  sp.engine.two_level = s.two_level;
  sp.engine.cuda = s.cuda;
  // The second step meets the cache the first one left (the steady state), and stage 3 prefetches from the
  // second pass on.
  sp.steps = 2;
  return sp;
}

int64_t device_overhead(const Setup& s) {
  return s.cuda ? kCudaContext + (s.world > 1 ? kNcclBuffers : 0) : 0;
}

int64_t required(const StepReplay& r, int64_t overhead) {
  return r.peak.total + r.peak.page_rounding + overhead;
}

// The largest micro-batch whose plan fits `mem` (0 when one image does not). Memory grows almost linearly
// with the micro-batch, so two plans give a first guess, and a search outwards from it brackets the answer
// in a few plans more (the planner must answer 16 of these for xlarge in well under a second).
int64_t largest_fitting(const Setup& s, const Engine& engine, bool checkpointing, int64_t mem) {
  const int64_t overhead = device_overhead(s);
  auto need = [&](int64_t b) {
    StepSpec sp = step_spec(s, engine, b, checkpointing);
    sp.steps = engine.plan.unit_gathers() ? 2 : 1;  // stages 0-2 repeat their first step's peak
    return required(replay_step(sp), overhead);
  };
  const int64_t one = need(1);
  if (one > mem) return 0;
  constexpr int64_t kProbe = 64;
  const double per_image = std::max(1.0, double(need(kProbe) - one) / double(kProbe - 1));
  const int64_t guess = std::clamp<int64_t>(1 + int64_t(double(mem - one) / per_image), 1, kMaxSearchedBatch);
  int64_t lo = 1, hi = 0, step = std::max<int64_t>(1, guess / 64);  // need(lo) fits, need(hi) does not
  if (need(guess) <= mem) {
    lo = guess;
    for (hi = lo + step; hi <= kMaxSearchedBatch && need(hi) <= mem; hi = lo + step) {
      lo = hi;
      step *= 2;
    }
    if (hi > kMaxSearchedBatch) return lo;
  } else {
    hi = guess;
    for (int64_t at = std::max<int64_t>(1, hi - step); at > 1 && need(at) > mem;
         at = std::max<int64_t>(1, hi - step)) {
      hi = at;
      step *= 2;
    }
    lo = std::max<int64_t>(1, hi - step);
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (need(mid) <= mem ? lo : hi) = mid;
  }
  return lo;
}

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string mib(int64_t b) {
  return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
}

std::string human(int64_t b) {
  const double v = double(b);
  if (v >= double(int64_t(1) << 30)) return fmt::format("{:.2f} GiB", v / double(int64_t(1) << 30));
  return mib(b);
}

// The loader's prefetch window (Loader: threads x prefetch 2 batches).
constexpr int64_t kLoaderPrefetch = 2;

// Note [What a run holds that a step does not decide] (planner.h).
void plan_the_run(const PlanRequest& req, Setup& s) {
  const int64_t last = req.last_step > 0 ? req.last_step : s.run.steps;  // 0: unknown (--epochs)
  const int64_t every = s.run.checkpoint_every;
  bool save_before_last = every > 0;
  if (every > 0 && last > 0) {
    const int64_t first_save = (std::max<int64_t>(req.first_step, 1) + every - 1) / every * every;
    save_before_last = first_save < last;
  }
  s.copy_in_flight = s.run.checkpoint_dir && !s.run.checkpoint_sync && save_before_last;
  // The default (-1) as the trainer resolves it, taking the planned ranks to share this host.
  const int threads =
      decide_cpu_threads(cpu_threads_request(parse_device(s.run.device).is_cuda(), s.run.zero.offload,
                                             s.run.loader_threads, req.world))
          .loader_threads;
  s.prefetched = int64_t(threads) * kLoaderPrefetch;
}

Setup setup_of(const PlanRequest& req) {
  Setup s;
  s.run = req.run;
  plan_the_run(req, s);
  s.run_steps = req.last_step > 0 ? req.last_step - req.first_step + 1 : 0;
  CZ_CHECK(req.world >= 1, "--ranks must be at least 1, got {}", req.world);
  CZ_CHECK(!req.gpu_mem || *req.gpu_mem > 0, "--gpu-mem must be positive, got {}", req.gpu_mem.value_or(0));
  s.cuda = parse_device(s.run.device).is_cuda();
  s.compute = s.run.compute;
  s.reduce = s.run.zero.reduce_dtype;
  s.world = req.world;
  CZ_CHECK(0 <= req.rank && req.rank < req.world, "plan: rank {} of a world of {}", req.rank, req.world);
  s.rank = req.rank;
  // The mesh (Note [2-D mesh]): the shard group's size from --shard-group, hosts of req.ranks_per_host.
  const int per_host = req.ranks_per_host > 0 ? req.ranks_per_host : s.world;
  CZ_CHECK(s.world % per_host == 0, "plan: {} ranks per host do not divide the {} ranks", per_host, s.world);
  s.shard = shard_group_size(s.run.shard_group, s.world, per_host);
  s.zero = s.run.zero;
  s.zero.device = s.cuda ? Device::cuda(0) : Device::cpu();
  s.mesh = {.world = s.world,
            .shard_group = s.shard,
            .hosts = s.world / per_host,
            .ranks_per_host = per_host,
            .flat_impl = s.run.world_algorithm == dist::Algorithm::ring};
  // --comm-impl hier or auto makes the world's communicator two-level on hosts of several ranks
  // (make_two_level_communicator; the mesh's other groups run the ring).
  const dist::Algorithm algorithm = s.run.world_algorithm;
  if (algorithm != dist::Algorithm::ring && per_host > 1 && per_host < s.world) {
    s.per_host = per_host;
    std::vector<std::vector<int>> hosts(size_t(s.world / per_host));
    for (int r = 0; r < s.world; ++r) hosts[size_t(r / per_host)].push_back(r);
    dist::Topology topology;
    if (req.topology) {
      CZ_CHECK(req.topology->num_ranks() == s.world, "plan: a topology of {} ranks for a world of {}",
               req.topology->num_ranks(), s.world);
      topology = *req.topology;
    } else if (algorithm == dist::Algorithm::automatic) {
      std::vector<dist::RankPlace> places;
      const dist::DetectOptions defaults;
      for (int r = 0; r < s.world; ++r) {
        dist::RankPlace p;
        p.rank = r;
        p.host = fmt::format("host{}", r / per_host);
        p.net_gbps = defaults.net_gbps;
        places.push_back(std::move(p));
      }
      topology = dist::build_topology(places, defaults);
    }
    const std::vector<int> ring =
        algorithm == dist::Algorithm::automatic ? topology.ring_order() : std::vector<int>{};
    // auto: NCCL, as on a box with a GPU per rank (Note [Choosing the comm backend]).
    const dist::Backend backend =
        s.cuda && s.run.comm_backend != "mpi" ? dist::Backend::nccl : dist::Backend::mpi;
    const Device device = s.cuda ? Device::cuda(0) : Device::cpu();
    s.two_level = [=](dist::Collective kind, int64_t bytes) {
      return dist::takes_two_levels(algorithm, backend, topology, ring, hosts, kind, size_t(bytes), device);
    };
  }
  s.spec = nn::convnext_spec(s.run.model);
  s.params = s.spec->parameters();
  return s;
}

}  // namespace

bool has_gpu_ranks(const dist::Topology& topology) {
  for (int r = 0; r < topology.num_ranks(); ++r)
    if (topology.nodes().at(size_t(topology.node_of_rank(r))).type == "gpu") return true;
  return false;
}

PlanDevice plan_device(const std::optional<std::string>& device_flag, bool gpu_mem,
                       const dist::Topology* what_if) {
  const char* const flag = "--device";
  if (device_flag) return {*device_flag, fmt::format("as {} says", flag)};
  if (what_if && has_gpu_ranks(*what_if))
    return {"cuda",
            fmt::format("the --what-if topology's ranks are GPUs and no {} was given ({} cpu plans the "
                        "CPU backend)",
                        flag, flag)};
  if (what_if)
    return {"cpu",
            fmt::format("the --what-if topology's ranks are CPU processes and no {} was given ({} cuda "
                        "plans GPUs)",
                        flag, flag)};
  if (gpu_mem)
    return {"cuda", fmt::format("--gpu-mem asks about GPU memory and no {} was given ({} cpu plans the CPU "
                                "backend)",
                                flag, flag)};
  return {"cpu", fmt::format("the default {} ({} cuda, or --gpu-mem, plans a GPU)", flag, flag)};
}

StepReplay plan_step_replay(const PlanRequest& req) {
  const Setup s = setup_of(req);
  const Engine engine = engine_at(s, s.run.zero.stage, s.run.zero.offload);
  return replay_step(step_spec(s, engine, s.run.micro_batch, s.run.checkpointing), -1, true);
}

constexpr const char* kCheckpointLabel = "checkpoint host copy (background save)";

// The model state by row, on the device and in host memory (offload, and on CUDA a background save's pinned
// copy); the device's rows are what the replay traced as state.
void add_state_rows(Plan& p, const Setup& s, const Engine& engine, const TraceSnapshot& pk) {
  const ZeroState& state = engine.state;
  static const std::map<StateRow, const char*> kLabels = {{StateRow::parameters, "parameters (compute copy)"},
                                                          {StateRow::master_weights, "master weights (fp32)"},
                                                          {StateRow::gradients, "gradients"},
                                                          {StateRow::optimizer_state, "optimizer state"},
                                                          {StateRow::ema, "EMA weights"}};
  for (const auto& [row, label] : kLabels) {
    p.rows.push_back({state_row_key(row), label, state.row_bytes(row)});
    if (state.host_row_bytes(row) > 0)
      p.host_rows.push_back({state_row_key(row), label, state.host_row_bytes(row)});
  }
  p.host_bytes = state.host_bytes();
  if (const int64_t copy = checkpoint_copy_bytes(s, engine); s.cuda && copy >= 0) {
    p.host_rows.push_back({"checkpoint_copy", kCheckpointLabel, copy});
    p.host_bytes += copy;
  }
  CZ_ASSERT(state.total_bytes() == pk.raw[size_t(Use::state)], "model state {} but {} traced",
            state.total_bytes(), pk.raw[size_t(Use::state)]);
}

// What else is live at the peak: buffers, the batch, activations saved by network part (and, for both
// settings of activation checkpointing, all that is saved when forward ends), temporaries, workspaces and
// the allocator's rounding.
void add_peak_rows(Plan& p, const Setup& s, const StepSpec& spec, const StepReplay& r) {
  const TraceSnapshot& pk = r.peak;
  p.rows.push_back({"comm_buffers", "gradient buckets / cast copies", pk.raw[size_t(Use::bucket)]});
  p.rows.push_back({"gather_buffers", "stage-3 gathered units", pk.raw[size_t(Use::gather)]});
  p.rows.push_back({"comm_scratch", "communicator ring scratch", pk.raw[size_t(Use::scratch)]});
  p.rows.push_back({"input_batch", "input batch (images, labels)", pk.raw[size_t(Use::input)]});
  p.rows.push_back({"checkpoint_copy", kCheckpointLabel, pk.raw[size_t(Use::checkpoint)]});
  const std::vector<std::string> parts = s.spec->parts();
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string key = "activations_" + parts[i];
    std::replace(key.begin(), key.end(), '.', '_');
    p.rows.push_back({key, "activations saved: " + parts[i], pk.saved_by_part[i]});
  }
  StepSpec other = spec;
  other.checkpointing = !spec.checkpointing;
  other.steps = 1;
  const StepReplay o = replay_step(other);
  for (size_t i = 0; i < parts.size(); ++i)
    for (bool ckpt : {false, true})
      p.saved_end_of_forward[ckpt].push_back(
          {parts[i], parts[i], (ckpt == spec.checkpointing ? r : o).saved_end_of_forward[i]});
  p.rows.push_back({"backward_transient", "backward temporaries", pk.raw[size_t(Use::transient)]});
  p.rows.push_back({"workspace", s.cuda ? "workspace (cuBLAS, cuDNN, depthwise)" : "workspace (im2col)",
                    pk.raw[size_t(Use::workspace)]});
  int64_t raw = 0;
  for (int64_t v : pk.raw) raw += v;
  p.rows.push_back({"allocator_rounding", "allocator size-class rounding", pk.total - raw});
  p.total_bytes = pk.total;
  p.peak_at = pk.where >= 0 ? r.labels.at(size_t(pk.where)) : "";
}

// The backward temporaries live at the peak, the four largest by what they are.
std::vector<std::pair<std::string, int64_t>> largest_temporaries(const StepReplay& r) {
  std::vector<std::pair<std::string, int64_t>> out;
  std::map<std::string, int64_t> temps;
  for (const LiveBuffer& b : r.at_peak)
    if (b.use == Use::transient) temps[b.what] += b.bytes;
  out.assign(temps.begin(), temps.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (out.size() > 4) out.resize(4);
  return out;
}

Plan make_plan(const PlanRequest& req) {
  const Setup s = setup_of(req);
  Plan p;
  p.model = s.spec->name();
  for (const nn::ParamInfo& i : s.params) p.num_params += i.numel;
  p.world = s.world;
  p.stage = s.run.zero.stage;
  p.device = s.cuda ? "cuda" : "cpu";
  p.device_reason = req.device_reason;
  p.precision = s.run.precision;
  p.image_size = s.run.image_size;
  p.micro_batch = s.run.micro_batch;
  p.checkpointing = s.run.checkpointing;

  const Engine engine = engine_at(s, s.run.zero.stage, s.run.zero.offload);
  p.psi = engine.state.psi;
  p.offload = s.run.zero.offload;
  const StepSpec spec = step_spec(s, engine, s.run.micro_batch, s.run.checkpointing);
  const StepReplay first = replay_step(spec);
  const StepReplay r = replay_step(spec, first.peak.event);
  const TraceSnapshot& pk = r.peak;

  add_state_rows(p, s, engine, pk);
  add_peak_rows(p, s, spec, r);
  p.largest_temporaries = largest_temporaries(r);

  p.fragmentation_bytes = pk.page_rounding;
  p.device_overhead_bytes = device_overhead(s);
  p.required_bytes = required(r, p.device_overhead_bytes);
  p.reserved_bytes = r.reserved_peak;
  p.gpu_mem = req.gpu_mem;
  if (req.gpu_mem) {
    p.fits = p.required_bytes <= *req.gpu_mem;
    if (req.max_micro_batch)
      for (int stage = 0; stage <= zero::kMaxStage; ++stage)
        for (bool offload : {false, true}) {
          const Engine e = engine_at(s, stage, offload);
          for (bool ckpt : {false, true})
            p.max_micro_batch.push_back({stage, ckpt, offload, largest_fitting(s, e, ckpt, *req.gpu_mem)});
        }
  }
  return p;
}

std::string format_plan(const Plan& p) {
  std::string out = fmt::format(
      "Memory plan per rank: {} ({} parameters, {} after padding), {}x{} images, micro-batch {}, {} on {}, "
      "ZeRO stage {} of {} rank{}, activation checkpointing {}, optimizer offload {}\n",
      p.model, with_commas(p.num_params), with_commas(p.psi), p.image_size, p.image_size, p.micro_batch,
      p.precision, p.device, p.stage, p.world, p.world == 1 ? "" : "s", p.checkpointing ? "on" : "off",
      p.offload ? "on" : "off");
  if (!p.device_reason.empty())
    out += fmt::format("Planned for the {} backend: {}.\n", p.device == "cuda" ? "CUDA" : "CPU",
                       p.device_reason);
  if (p.device == "cpu" && p.precision == "bf16")
    out +=
        "bf16 on the CPU is the GEMMs' precision (Note [bf16 on the CPU]): the model, its copies and its "
        "activations are fp32, planned as an fp32 run; the rounded GEMM operands live outside the "
        "allocator, as OpenBLAS's packing buffers do.\n";
  out += "\n";
  auto line = [&](const std::string& label, int64_t b) {
    out += fmt::format("  {:<44} {:>17} B  {:>12}\n", label, with_commas(b), mib(b));
  };
  for (const PlanRow& r : p.rows) line(r.label, r.bytes);
  out += fmt::format("  {:-<80}\n", "");
  line("total: the allocator's planned peak", p.total_bytes);
  if (p.device == "cuda") {
    line("driver pages (2 MiB per large block)", p.fragmentation_bytes);
    line("CUDA context, NCCL (allowance)", p.device_overhead_bytes);
    line("required", p.required_bytes);
  }
  if (!p.host_rows.empty()) {
    out += fmt::format("  in pinned host memory ({}; not in the total):\n",
                       p.offload ? "--offload-optimizer" : "a background checkpoint's copy");
    for (const PlanRow& r : p.host_rows) line("  " + r.label, r.bytes);
    line("  host total", p.host_bytes);
  }
  if (p.gpu_mem) {
    const int64_t spare = *p.gpu_mem - p.required_bytes;
    out += fmt::format("  --gpu-mem {} ({}): {}\n", with_commas(*p.gpu_mem), human(*p.gpu_mem),
                       *p.fits ? fmt::format("fits, {} to spare", human(spare))
                               : fmt::format("does NOT fit, {} short", human(-spare)));
  }
  out += fmt::format("\nThe peak falls in {}", p.peak_at);
  if (!p.largest_temporaries.empty()) {
    out += "; the largest temporaries then:";
    for (size_t i = 0; i < p.largest_temporaries.size(); ++i)
      out += fmt::format("{} {} {}", i ? "," : "", p.largest_temporaries[i].first,
                         mib(p.largest_temporaries[i].second));
  }
  out += ".\nSaved for backward when forward ends:\n";
  for (bool ckpt : {false, true}) {
    int64_t saved = 0;
    out += fmt::format("  {:<27}", ckpt ? "with checkpointing:" : "without checkpointing:");
    for (size_t i = 0; i < p.saved_end_of_forward[ckpt].size(); ++i) {
      const PlanRow& r = p.saved_end_of_forward[ckpt][i];
      out += fmt::format("{} {} {}", i ? "," : "", r.label, mib(r.bytes));
      saved += r.bytes;
    }
    out += fmt::format(" (total {})\n", mib(saved));
  }
  out += fmt::format(
      "The allocator's cache at its fullest: {} (it returns the cache to the system before failing an "
      "allocation).\n",
      mib(p.reserved_bytes));
  if (!p.max_micro_batch.empty()) {
    out += fmt::format("\nLargest micro-batch that fits {} per rank ({} rank{}):\n", human(*p.gpu_mem),
                       p.world, p.world == 1 ? "" : "s");
    out += fmt::format("  {:<11} {:>17} {:>15} {:>12} {:>26}\n", "ZeRO stage", "no checkpointing",
                       "checkpointing", "offload", "offload + checkpointing");
    int64_t v[zero::kMaxStage + 1][2][2] = {};  // [stage][offload][checkpointing]
    for (const MaxMicroBatch& m : p.max_micro_batch) v[m.stage][m.offload][m.checkpointing] = m.micro_batch;
    for (int stage = 0; stage <= zero::kMaxStage; ++stage)
      out += fmt::format("  {:<11} {:>17} {:>15} {:>12} {:>26}\n", stage, v[stage][0][0], v[stage][0][1],
                         v[stage][1][0], v[stage][1][1]);
  }
  return out;
}

// The rows whose test (tests/dist/plan/run_cuda_plan_rows.sh) passed on a GPU: planned within 1% of the
// peak the caching allocator measured. atto_np1 (one rank, the step in CUDA graphs) measured 1.8% above
// its plan on that run and stays unchecked (docs/planning.md).
const std::vector<CheckedCudaRow>& checked_cuda_rows() {
  static const std::vector<CheckedCudaRow> rows = {
      {"convnext_tiny", 224, 64, 1, 0, "bf16", "H200, 2026-11-28: -0.14%"},
      {"convnext_tiny", 224, 128, 1, 0, "bf16", "H200, 2026-11-28: +0.01%"},
      {"convnext_atto", 64, 32, 2, 3, "bf16", "H200, 2026-11-28: -0.79%"},
      {"convnext_atto", 64, 32, 4, 3, "bf16", "H200, 2026-11-28: -1.00%"},
  };
  return rows;
}

std::string plan_difference(const Plan& p, int64_t measured) {
  return plan_difference(p, measured, checked_cuda_rows());
}

std::string plan_difference(const Plan& p, int64_t measured, const std::vector<CheckedCudaRow>& checked) {
  const int64_t off = p.total_bytes - measured;
  if (off == 0) return "";
  const int64_t b = std::abs(off);
  const std::string by =
      fmt::format("{} {}", b < (1 << 20) ? fmt::format("{:.1f} KiB", double(b) / 1024) : human(b),
                  off > 0 ? "high" : "low");
  int64_t scratch = 0;
  for (const PlanRow& r : p.rows)
    if (r.key == "comm_scratch") scratch = r.bytes;
  if (p.world > 1 && off > 0 && off <= scratch)
    return fmt::format("{}: the communicators' threads grow their ring scratch at times of their own", by);
  const auto is_this_run = [&](const CheckedCudaRow& r) {
    return r.model == p.model && r.image_size == p.image_size && r.micro_batch == p.micro_batch &&
           r.world == p.world && r.stage == p.stage && r.precision == p.precision;
  };
  const auto row = std::find_if(checked.begin(), checked.end(), is_this_run);
  if (p.device == "cuda" && row == checked.end())
    return fmt::format("{}: the plan is not yet checked against a GPU", by);
  // A checked row was held to 1% of the measured peak: a difference within that is the row's own.
  if (p.device == "cuda" && 100 * b <= measured)
    return fmt::format("{}: within the 1% this row was checked to ({})", by, row->checked_on);
  return fmt::format("{}: not expected, see docs/planning.md", by);
}

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json j = {{"model", p.model},
                      {"num_params", p.num_params},
                      {"psi", p.psi},
                      {"world", p.world},
                      {"stage", p.stage},
                      {"device", p.device},
                      {"device_reason", p.device_reason},
                      {"precision", p.precision},
                      {"image_size", p.image_size},
                      {"micro_batch", p.micro_batch},
                      {"activation_checkpointing", p.checkpointing},
                      {"offload_optimizer", p.offload}};
  for (const PlanRow& r : p.rows) j[r.key + "_bytes"] = r.bytes;
  j["total_bytes"] = p.total_bytes;
  nlohmann::json host = nlohmann::json::object();
  for (const PlanRow& r : p.host_rows) host[r.key + "_bytes"] = r.bytes;
  host["total_bytes"] = p.host_bytes;
  j["host_state"] = host;
  j["fragmentation_bytes"] = p.fragmentation_bytes;
  j["device_overhead_bytes"] = p.device_overhead_bytes;
  j["required_bytes"] = p.required_bytes;
  j["reserved_bytes"] = p.reserved_bytes;
  j["gpu_mem_bytes"] = p.gpu_mem ? nlohmann::json(*p.gpu_mem) : nlohmann::json();
  j["fits"] = p.fits ? nlohmann::json(*p.fits) : nlohmann::json();
  j["peak_at"] = p.peak_at;
  nlohmann::json temps = nlohmann::json::array();
  for (const auto& [what, bytes] : p.largest_temporaries) temps.push_back({{"what", what}, {"bytes", bytes}});
  j["largest_temporaries"] = temps;
  nlohmann::json saved = nlohmann::json::object();
  for (bool ckpt : {false, true})
    for (const PlanRow& r : p.saved_end_of_forward[ckpt])
      saved[ckpt ? "checkpointing" : "no_checkpointing"][r.key] = r.bytes;
  j["activations_saved_end_of_forward"] = saved;
  nlohmann::json mb = nlohmann::json::array();
  for (const MaxMicroBatch& m : p.max_micro_batch)
    mb.push_back({{"stage", m.stage},
                  {"activation_checkpointing", m.checkpointing},
                  {"offload", m.offload},
                  {"micro_batch", m.micro_batch}});
  j["max_micro_batch"] = mb;
  return j;
}

int64_t parse_memory_size(const std::string& text, const std::string& flag) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  CZ_CHECK(i == text.size() || text[i] != '-', "{} must be positive, got '{}'", flag, text);
  const size_t start = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(start, i - start);
  char* end = nullptr;
  const double value = number.empty() ? NAN : std::strtod(number.c_str(), &end);
  CZ_CHECK(!number.empty() && end == number.c_str() + number.size() && std::isfinite(value),
           "{}: '{}' is not a memory size (expected a number and a unit, e.g. 24GB, 24GiB or 512MiB)", flag,
           text);
  std::string unit;
  for (; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i])))
      unit += char(std::tolower(static_cast<unsigned char>(text[i])));
  static const std::map<std::string, double> kUnits = {
      {"", 1},      {"b", 1},        {"kb", 1e3},        {"mb", 1e6},           {"gb", 1e9},
      {"tb", 1e12}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  const auto it = kUnits.find(unit);
  CZ_CHECK(it != kUnits.end(),
           "{}: unknown unit '{}' in '{}' (expected B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", flag,
           text.substr(text.find_first_not_of(" 0123456789.")), text);
  const double bytes = std::floor(value * it->second);
  CZ_CHECK(bytes >= 1, "{} must be positive, got '{}'", flag, text);
  CZ_CHECK(bytes < 9e18, "{}: '{}' is too large", flag, text);
  return int64_t(bytes);
}

namespace {
// The first of `vars` that is set, as an integer in [lo, 2^20]; `fallback` when none is.
int launcher_value(std::initializer_list<const char*> vars, int lo, int fallback) {
  for (const char* var : vars) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    CZ_CHECK(*end == '\0' && n >= lo && n <= (1 << 20), "the launcher's {}='{}' is not a valid value", var,
             v);
    return int(n);
  }
  return fallback;
}
}  // namespace

int launcher_world_size() {
  return launcher_value(
      {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS"}, 1, 1);
}

int launcher_ranks_per_host() {
  if (const char* sim = std::getenv("CZ_SIMULATE_HOSTS"); sim && *sim) return std::atoi(sim);
  return launcher_value({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, 1, 0);
}

int launcher_rank() {
  return launcher_value(
      {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"}, 0, 0);
}

}  // namespace cz::plan
