// The ZeRO engine: the buffers each stage keeps, handed to the parts that own them, and the walk of one step
// through the parts.
//
// Note [ZeRO step]: what each stage keeps and sends (Psi = parameters, N = ranks; docs/zero.md has the
// table):
//   stage 0: full params + full grads + full state; each bucket is all-reduced (averaged) as soon as backward
//            has filled it, on the last micro-step (the full gradient buffer accumulates the others).
//   stage 1: the same full params and grads; each bucket is reduce-scattered in place instead, so this rank's
//            chunk of it holds the average; the optimizer updates only its chunks (of the full params, in
//            place) and each partition is all-gathered in place afterwards.
//   stage 2: no full gradient buffer: the grad-ready hook copies each gradient into its bucket (allocated
//            when the bucket's first gradient arrives) and drops the parameter's .grad; a full bucket is
//            reduce- scattered and its chunk added to the fp32 gradient shard, then freed. Every micro-step
//            does this.
//   stage 3: as stage 2 with units for buckets, and parameters sharded too (Note [Stage-3 units]).
// At most two collectives are in flight: a third waits for the oldest, which bounds the bucket memory.
// On a 2-D mesh (--shard-group, Note [2-D mesh] in dist/comm/mesh.h) stages 1-3 shard over the shard group of
// S ranks instead of the world: the layout has S shards, each bucket is reduce-scattered (averaged) inside
// the shard group and this rank's chunk of it then all-reduced (averaged) across the replication group, the
// W/S ranks holding the same chunk (GradReducer: Note [Cross all-reduce]); the mean of equal groups' means is
// the world's mean. The global norm and the fp16 overflow decision sum over the shard group only (the
// replicas hold equal chunks); stages 1-2 all-gather the parameters in the shard group. Stage 0 is unchanged.
// The parts: stages 0-1 reduce in place in the full gradient buffer and stages 2-3 in buckets (GradReducer's
// mode); stage 0 all-reduces, stages 1-3 reduce-scatter; the ShardedState is sharded over the shard group
// (the world, unless --shard-group makes a 2-D mesh) at stages 1-3 and over a group of one at stage 0; the
// gatherer is the ChunkGatherer at stages 1-2, the UnitGatherer at stage 3, none at stage 0. The stage itself
// is read once, by the step plan (Note [Step plan], Note [What each rank keeps]): the parts are built here
// from its answers.
//
// Note [Overlapped parameter all-gather]: at stages 1-2 the updated chunks are all-gathered after the step,
// when nothing is left to overlap them with, so they are only launched there; each unit's forward-pre hook
// (ConvNeXt::units(): stem, downsamples, blocks, head) waits for the partitions holding its parameters
// (ChunkSchedule in schedule.h, which the planner's replay runs too). Partitions follow registration order,
// which is ConvNeXt's forward order, so the all-gathers run on the communication thread while the next
// forward computes. Anything else that reads or writes the parameters (the next step, EMA swaps, export)
// waits for all first. Under mixed precision the fp32 master weights are this rank's chunks (master_), the
// model runs on a 16-bit copy that is refreshed (cast, then all-gathered at stages 1-2) after each update.
#include "dist/zero/engine.h"

#include "dist/zero/held_bytes.h"
#include "dist/zero/schedule.h"
#include "tensor/autograd/engine.h"
#include "tensor/ops.h"

namespace cz::zero {
// The buffers are allocated in one order, which the memory planner replays (plan/step_replay.cpp): the flat
// copy, this rank's chunks, the master chunks, the compute copy (stage 3: its shard and the units'
// buffers), the full gradient buffer, the gradient shard, the optimizer state, the EMA.
ZeroGroups ZeroGroups::flat(const dist::ProcessGroup& world) {
  const int me = world.ranks()[size_t(world.rank())];
  ZeroGroups g;
  g.world = g.shard = world;
  g.replicate = g.host = g.cross = dist::ProcessGroup(world.device(), me);
  return g;
}

ZeroEngine::ZeroEngine(nn::Module& model, const std::vector<std::string>& units,
                       const dist::ProcessGroup& group, ZeroConfig cfg, const MakeOptimizer& make_optimizer,
                       const MakeEma& make_ema)
    : ZeroEngine(model, units, ZeroGroups::flat(group), make_step_plan(cfg, {.world = group.size()}),
                 make_optimizer, make_ema) {}

// What the constructor's steps hand each other.
struct ZeroEngine::Build {
  // What the state is sharded over: the shard group (the world when flat), or at stage 0 a group of one
  // (every rank holds all of it).
  dist::ProcessGroup shard_group;
  std::vector<std::pair<std::string, Tensor>> named;  // the model's parameters, in layout order
  std::vector<Tensor> params;
  FlatParams flat;    // flatten_parameters: the full fp32 copy and its gradients
  Tensor master;      // this rank's fp32 master chunks, where separate from the compute copy (own_master)
  Tensor grads;       // full_grads: the full gradient buffer (compute dtype) the .grads view
  Tensor grad_shard;  // grad_chunks: this rank's fp32 gradient chunks
  UnitSchedule::Sink* unit_sink = nullptr;    // stage 3: the unit gatherer
  ChunkSchedule::Sink* chunk_sink = nullptr;  // stages 1-2: the chunk gatherer
};

ZeroEngine::ZeroEngine(nn::Module& model, const std::vector<std::string>& units, ZeroGroups groups,
                       StepPlan plan, const MakeOptimizer& make_optimizer, const MakeEma& make_ema)
    : groups_(std::move(groups)), plan_(std::move(plan)), cfg_(plan_.config()) {
  check_config();
  meter_.set_hosts(groups_.host_of);
  Build b;
  b.shard_group = plan_.sharded() ? groups_.shard : dist::ProcessGroup(cfg_.device);
  b.named = model.named_parameters();
  for (const auto& [name, p] : b.named) b.params.push_back(p);
  lay_out(b, units);
  NoGradGuard no_grad;
  build_parameters(b, model);
  build_gradients(b);
  build_state(b, make_optimizer, make_ema);
  build_chunk_gatherer(b, model, units);
  schedule_->bind(&reducer_->sink(), b.unit_sink, b.chunk_sink);
  if (gatherer_) {
    // What a gather encodes: the fp32 master chunks where they are on the device, else (offload: on the
    // host) the compute chunks, written from them just before.
    gatherer_->set_sources(plan_.offload() ? compute_chunks_ : state_->weights());
  }
  // The first forward sees gathered values too, as every later one does.
  if (!plan_.codec().direct()) refresh_compute();
}

void ZeroEngine::check_config() const {
  const GatherCodec& codec = plan_.codec();
  // The flag table checks --prefetch (train/flags_zero.cpp); a caller that skipped it is a bug.
  CZ_ASSERT(cfg_.prefetch >= 0 && cfg_.prefetch <= kMaxPrefetch, "ZeRO: prefetch {} outside 0-{}",
            cfg_.prefetch, kMaxPrefetch);
  CZ_CHECK(cfg_.bucket_bytes > 0, "ZeRO: the bucket size must be positive, got {} bytes", cfg_.bucket_bytes);
  CZ_CHECK_DEVICE(cfg_.compute_dtype == DType::f32 || cfg_.device.is_cuda(),
                  "ZeRO: {} compute needs a CUDA device (the CPU backend computes in fp32)",
                  dtype_name(cfg_.compute_dtype));
  CZ_CHECK(groups_.world.device() == cfg_.device,
           "ZeRO: the process group's buffers are on {}, the engine's on {}", groups_.world.device().str(),
           cfg_.device.str());
  CZ_CHECK(groups_.shard.size() * groups_.replicate.size() == groups_.world.size(),
           "ZeRO: a mesh of shard groups of {} and replication groups of {} on {} ranks",
           groups_.shard.size(), groups_.replicate.size(), groups_.world.size());
  CZ_ASSERT(
      plan_.world() == groups_.world.size() && (!plan_.sharded() || plan_.shards() == groups_.shard.size()),
      "ZeRO: a step plan for {} ranks in shard groups of {}, on {} ranks in groups of {}", plan_.world(),
      plan_.shards(), groups_.world.size(), groups_.shard.size());
  CZ_CHECK(!cfg_.hpz || plan_.unit_gathers(), "ZeRO: --hpz is for --stage 3, got --stage {}", plan_.stage());
  CZ_CHECK(!cfg_.hpz || groups_.replicate.size() == 1,
           "ZeRO: --hpz shards over the world; with --shard-group the shard already stays on the host");
  CZ_CHECK(codec.direct() || plan_.sharded(),
           "ZeRO: gathering parameters in {} is for stages 1-3 (stage 0 gathers nothing)",
           cfg_.gather_dtype == DType::u8 ? "int8" : dtype_name(cfg_.gather_dtype));
  CZ_CHECK_DEVICE(codec.kind() != GatherCodec::Kind::cast || !cfg_.device.is_cuda(),
                  "ZeRO: gathering {} parameters in {} runs on the CPU only", dtype_name(cfg_.compute_dtype),
                  dtype_name(cfg_.gather_dtype));
  CZ_CHECK(!cfg_.reduce_int8 || (groups_.replicate.size() == 1 && cfg_.reduce_dtype == DType::f32),
           "ZeRO: int8 gradient reductions are for runs without --shard-group, in f32 buckets");
}

// The partitions (buckets at stages 0-2, units at stage 3) and the step's schedule over them.
void ZeroEngine::lay_out(const Build& b, const std::vector<std::string>& units) {
  std::vector<ParamShape> shapes;
  for (const auto& [name, p] : b.named) shapes.push_back({name, p.sizes()});
  const std::vector<std::string> unit_of =
      plan_.unit_gathers() ? assign_units(shapes, units) : std::vector<std::string>{};
  int64_t params = 0;
  for (const ParamShape& p : shapes) params += shape_numel(p.shape);
  layout_ = plan_layout(shapes, plan_, plan_.bucket_elems(params), unit_of);
  schedule_ = std::make_unique<StepSchedule>(plan_, layout_, cfg_.prefetch, units);
}

// The flat copy (rank 0's weights on every rank), this rank's chunks, the master chunks, the compute copy
// (stage 3: its shard and the unit gatherer).
void ZeroEngine::build_parameters(Build& b, nn::Module& model) {
  const size_t np = layout_.partitions.size();
  const int me = b.shard_group.rank();
  const Device dev = cfg_.device;
  const bool mixed = plan_.mixed(), offload = plan_.offload();
  b.flat = flatten_parameters(b.named, layout_.flat);
  // Every rank starts from rank 0's weights.
  if (dist::WorkHandle w = groups_.world.broadcast(b.flat.params, 0)) w->wait();
  auto my_chunks = [&](const Tensor& full) {
    Tensor out = empty({layout_.shard_numel()}, full.dtype(), dev);
    for (size_t p = 0; p < np; ++p) {
      const ShardRange r = layout_.chunk_range(p, me);
      out.narrow(0, layout_.local_offset(p), r.numel()).copy_(full.narrow(0, r.begin, r.numel()));
    }
    return out;
  };
  // Note [What each rank keeps].
  const Tensor chunks = !plan_.full_params() || plan_.own_master() ? my_chunks(b.flat.params) : Tensor();
  if (offload) {
    b.master = empty_pinned({layout_.shard_numel()}, DType::f32);
    b.master.copy_(chunks);
  } else if (plan_.own_master()) {
    b.master = chunks;
  }
  if (!plan_.full_params()) {
    Tensor shard = mixed ? chunks.to(cfg_.compute_dtype) : chunks;
    for (size_t p = 0; p < np; ++p)
      compute_chunks_.push_back(shard.narrow(0, layout_.local_offset(p), layout_.chunk(p)));
    auto units_gatherer = std::make_unique<UnitGatherer>(
        layout_, model, b.params, shard, *schedule_, b.shard_group, meter_, plan_.codec(),
        plan_.hpz() ? std::optional(groups_.host) : std::nullopt);
    b.unit_sink = &units_gatherer->sink();
    gatherer_ = std::move(units_gatherer);
  } else {
    params_ = mixed ? b.flat.params.to(cfg_.compute_dtype) : b.flat.params;
    if (mixed) bind_parameters(b.named, layout_.flat, params_);
    for (size_t p = 0; p < np; ++p)
      compute_chunks_.push_back(params_.narrow(0, layout_.chunk_range(p, me).begin, layout_.chunk(p)));
  }
}

// The full gradient buffer the .grads view (stages 0-1) or none (buckets), the fp32 gradient chunks, and
// the reducer. Stage 0 all-reduces over the world; stages 1-3 reduce-scatter in the shard group, then
// all-reduce the chunk across the replication group.
void ZeroEngine::build_gradients(Build& b) {
  const bool mixed = plan_.mixed();
  if (plan_.full_grads()) {
    b.grads = mixed ? zeros({layout_.flat.numel}, cfg_.compute_dtype, cfg_.device) : b.flat.grads;
    for (size_t i = 0; i < b.named.size(); ++i) {
      const FlatSegment& s = layout_.flat.segments[i];
      b.params[i].set_grad(view_of_storage(b.grads, s.shape, b.grads.offset() + s.offset));
    }
  } else {
    for (Tensor& p : b.params) p.set_grad(Tensor());
  }
  if (plan_.grad_chunks() && plan_.offload()) {
    b.grad_shard = empty_pinned({layout_.shard_numel()}, DType::f32);
    b.grad_shard.zero_();
  } else if (plan_.grad_chunks()) {
    b.grad_shard = zeros({layout_.shard_numel()}, DType::f32, cfg_.device);
  }
  const bool sharded = plan_.sharded();
  reducer_ = std::make_unique<GradReducer>(
      layout_, b.params, b.grads, sharded ? b.shard_group : groups_.world,
      sharded ? groups_.replicate : dist::ProcessGroup(cfg_.device), meter_, *schedule_);
  if (plan_.two_hop()) reducer_->set_two_hop(groups_.host, groups_.cross, groups_.hosts);
}

// The sharded state (master and gradient chunks, the optimizer, the EMA), the offload worker, and where the
// reducer hands each reduced chunk.
void ZeroEngine::build_state(Build& b, const MakeOptimizer& make_optimizer, const MakeEma& make_ema) {
  std::vector<Tensor> weights, grad_chunks, from_compute;
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    const int64_t off = layout_.local_offset(p), c = layout_.chunk(p);
    weights.push_back(b.master.defined() ? b.master.narrow(0, off, c) : compute_chunks_[p]);
    grad_chunks.push_back(b.grad_shard.defined() ? b.grad_shard.narrow(0, off, c) : reducer_->grad_chunk(p));
    // Mixed precision at stages 0-1: the fp32 master gradients are copied from the 16-bit ones.
    if (plan_.full_grads() && b.grad_shard.defined() && !plan_.offload())
      from_compute.push_back(reducer_->grad_chunk(p));
  }
  state_ = std::make_unique<ShardedState>(layout_, b.shard_group, b.master, b.grad_shard, plan_.offload(),
                                          std::move(weights), std::move(grad_chunks), std::move(from_compute),
                                          make_optimizer, make_ema);
  if (plan_.offload()) {
    offload_ = std::make_unique<OffloadWorker>(*state_, layout_, cfg_.device, cfg_.offload_overlap_step);
    reducer_->set_sink(
        [this](size_t p, const Tensor& chunk, bool final) { offload_->receive(p, chunk, final); });
  } else if (plan_.buckets()) {
    reducer_->set_sink([this](size_t p, const Tensor& chunk, bool) { state_->receive(p, chunk); });
  }
}

// Stages 1-2: the gatherer of the updated chunks (stage 3's was built with the parameters).
void ZeroEngine::build_chunk_gatherer(Build& b, nn::Module& model, const std::vector<std::string>& units) {
  if (!plan_.chunk_gathers()) return;
  auto chunks_gatherer = std::make_unique<ChunkGatherer>(layout_, model, units, params_, compute_chunks_,
                                                         b.shard_group, meter_, plan_.codec(), *schedule_);
  b.chunk_sink = &chunks_gatherer->sink();
  gatherer_ = std::move(chunks_gatherer);
}

ZeroEngine::~ZeroEngine() {
  // Hooks off and collectives waited for, before the buffers they use go; then the worker drains.
  reducer_.reset();
  gatherer_.reset();
  offload_.reset();
}

// ---- the step, part by part ----

void ZeroEngine::begin_step(double lr, double clip_grad, const LossScaler& scaler) {
  reducer_->begin_step();
  state_->begin_step(UpdateArgs{lr, clip_grad, scaler.enabled() ? 1.0 / scaler.scale() : 1.0});
  if (offload_) offload_->begin_step(clip_grad > 0 || scaler.enabled());
  meter_.begin_step();
}

void ZeroEngine::backward(const Tensor& loss, bool last_micro_step) {
  schedule_->begin_backward(last_micro_step);
  try {
    loss.backward();  // the reducer's hooks launch the reductions, the gatherer's the stage-3 gathers
  } catch (...) {
    schedule_->end_backward(false);
    throw;
  }
  schedule_->end_backward(true);  // what is left reduced, the units released (Note [Step plan])
}

void ZeroEngine::step(LossScaler& scaler, StepStats& s) {
  NoGradGuard no_grad;
  if (gatherer_) gatherer_->wait_all();  // a forward without some module (none in ConvNeXt) would leave one
  if (offload_)
    offload_->step(scaler, s, [this] { refresh_compute(); });
  else if (state_->step(scaler, s))
    refresh_compute();
  meter_.finish_step(s);
  s.model_state_bytes = model_state_bytes();
}

void ZeroEngine::use_device_update() {
  CZ_CHECK(!offload_ && !gatherer_, "ZeRO: the update from device scalars needs stage 0 without offload");
  state_->use_device_scalars();
}

void ZeroEngine::device_update(bool loss_scaling) {
  NoGradGuard no_grad;
  state_->device_step(loss_scaling);
  refresh_compute();  // also on a skipped step: the master weights are unchanged, so is their copy
}

void ZeroEngine::finish_device_update(LossScaler& scaler, StepStats& s) {
  state_->finish_device_step(scaler, s);
  meter_.finish_step(s);
  s.model_state_bytes = model_state_bytes();
}

void ZeroEngine::refresh_compute() {
  state_->write_compute(compute_chunks_);
  if (gatherer_) gatherer_->after_update();
}

void ZeroEngine::synchronize() {
  if (gatherer_) gatherer_->wait_all();
  if (offload_ && offload_->drain()) {
    refresh_compute();
    if (gatherer_) gatherer_->wait_all();
  }
}

// ---- outside the step ----

void ZeroEngine::swap_ema() {
  CZ_CHECK(state_->ema() != nullptr, "ZeRO: swap_ema without --ema-decay");
  synchronize();
  state_->ema()->swap(std::span<const Tensor>(state_->weights()));
  refresh_compute();
}

std::vector<std::pair<std::string, Tensor>> ZeroEngine::master_parameters() {
  NoGradGuard no_grad;
  synchronize();
  const std::vector<Tensor>& w = state_->weights();
  const int me = state_->group().rank();
  Tensor full = zeros({layout_.flat.numel}, DType::f32, cfg_.device);
  std::vector<dist::WorkHandle> works;
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    const Partition& part = layout_.partitions[p];
    Tensor dst = full.narrow(0, part.begin, part.numel);
    Tensor mine = dst.narrow(0, me * layout_.chunk(p), layout_.chunk(p));
    mine.copy_(w[p]);  // from the host under offload
    if (state_->group().size() > 1) works.push_back(state_->group().all_gather(mine, dst));
  }
  for (auto& wk : works) wk->wait();
  std::vector<std::pair<std::string, Tensor>> out;
  for (const FlatSegment& s : layout_.flat.segments)
    out.emplace_back(s.name, view_of_storage(full, s.shape, full.offset() + s.offset));
  return out;
}

std::vector<std::pair<std::string, std::vector<ZeroEngine::OwnedChunk>>> ZeroEngine::owned_state(
    bool for_save) {
  synchronize();
  std::vector<std::pair<std::string, std::vector<OwnedChunk>>> out;
  for (auto& [kind, chunks] : state_->owned()) {
    std::vector<OwnedChunk> v;
    // A replicated state is written by one replica: at stage 0 rank 0, on a mesh the first rank of each
    // replication group (their states are equal); the others name the kinds.
    const bool writes =
        (state_->group().size() > 1 || groups_.world.rank() == 0) && groups_.replicate.rank() == 0;
    if (!for_save || writes)
      for (auto& [range, values] : chunks) v.push_back({range, values});
    out.emplace_back(kind, std::move(v));
  }
  return out;
}

void ZeroEngine::after_load(int64_t optimizer_steps) {
  state_->optimizer().set_step_count(optimizer_steps);
  refresh_compute();
  if (gatherer_) gatherer_->wait_all();
}

int64_t ZeroEngine::model_state_bytes() const {
  int64_t n = held_bytes(params_) + reducer_->state_bytes() + (gatherer_ ? gatherer_->state_bytes() : 0);
  if (!offload_) n += state_->state_bytes();
  return n;
}

int64_t ZeroEngine::host_state_bytes() const {
  return offload_ ? state_->state_bytes() : 0;
}

}  // namespace cz::zero
