// The ZeRO engine: buffers per stage, gradient buckets reduced from the grad-ready hooks while backward runs,
// and the sharded optimizer step.
//
// Note [ZeRO step]: what each stage keeps and sends (Psi = parameters, N = ranks; docs/zero.md has the
// table):
//   stage 0: full params + full grads + full state; each bucket is all-reduced (averaged) as soon as backward
//            has filled it, on the last micro-step (the full gradient buffer accumulates the others).
//   stage 1: the same full params and grads; each bucket is reduce-scattered in place instead, so this rank's
//            chunk of it holds the average; the optimizer updates only its chunks (of the full params, in
//            place) and each partition is all-gathered in place afterwards.
//   stage 2: no full gradient buffer: the grad-ready hook copies each gradient into its bucket (allocated
//   when
//            the bucket's first gradient arrives) and drops the parameter's .grad; a full bucket is reduce-
//            scattered and its chunk added to the fp32 gradient shard, then freed. Every micro-step does
//            this.
//   stage 3: as stage 2 with units for buckets, and parameters sharded too (Note [Stage-3 units]).
// At most two collectives are in flight: a third waits for the oldest, which bounds the bucket memory.
//
// Note [Overlapped parameter all-gather]: at stages 1-2 the updated chunks are all-gathered after the step,
// when nothing is left to overlap them with, so they are only launched there; each module's forward-pre hook
// waits for the partitions holding its parameters. Partitions follow registration order, which is ConvNeXt's
// forward order, so the all-gathers run on the communication thread while the next forward computes.
// Anything else that reads or writes the parameters (the next step, EMA swaps, export) waits for all first.
// Under mixed precision the fp32 master weights are this rank's chunks (master_), the model runs on a 16-bit
// copy that is refreshed (cast, then all-gathered at stages 1-2) after each update.
#include "dist/zero/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "dist/zero/host_worker.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "tensor/autograd/engine.h"
#include "tensor/ops.h"

namespace cz::zero {
namespace {

using Clock = std::chrono::steady_clock;

int64_t held_bytes(const Tensor& t) {
  return t.defined() ? int64_t(round_to_size_class(t.storage()->nbytes())) : 0;
}

}  // namespace

ZeroEngine::ZeroEngine(nn::Module& model, const std::vector<std::string>& units, dist::Communicator* comm,
                       ZeroConfig cfg)
    : cfg_(std::move(cfg)), comm_(comm) {
  CZ_CHECK(cfg_.stage >= 0 && cfg_.stage <= 3, "ZeRO: --stage must be 0-3, got {}", cfg_.stage);
  CZ_CHECK(cfg_.prefetch >= 0, "ZeRO: --prefetch must be >= 0, got {}", cfg_.prefetch);
  CZ_CHECK(cfg_.bucket_bytes > 0, "ZeRO: the bucket size must be positive, got {} bytes", cfg_.bucket_bytes);
  CZ_CHECK_DEVICE(cfg_.compute_dtype == DType::f32 || cfg_.device.is_cuda(),
                  "ZeRO: {} compute needs a CUDA device (the CPU backend computes in fp32)",
                  dtype_name(cfg_.compute_dtype));
  if (comm_) {
    rank_ = comm_->rank();
    world_ = comm_->size();
  }
  shard_rank_ = cfg_.stage == 0 ? 0 : rank_;
  const auto named = model.named_parameters();
  std::vector<ParamShape> shapes;
  for (const auto& [name, p] : named) shapes.push_back({name, p.sizes()});
  std::vector<std::string> unit_of;
  if (cfg_.stage == 3) unit_of = assign_units(shapes, units);
  int64_t params = 0;
  for (const ParamShape& p : shapes) params += shape_numel(p.shape);
  layout_ =
      plan_layout(shapes, cfg_.stage, world_,
                  bucket_elems(double(cfg_.bucket_bytes), dtype_size(cfg_.reduce_dtype), params), unit_of);
  for (size_t p = 0; p < layout_.partitions.size(); ++p)
    for (size_t i = layout_.partitions[p].first_param; i < layout_.partitions[p].end_param; ++i)
      param_partition_.push_back(p);
  const size_t np = layout_.partitions.size();
  remaining_.assign(np, 0);
  launched_.assign(np, false);
  buckets_.resize(np);
  gathered_.resize(np);
  gather_state_.assign(np, Gather::resident);
  gather_work_.resize(np);
  param_gather_.resize(np);
  position_.assign(np, 0);
  if (cfg_.offload) {
    worker_ = std::make_unique<HostWorker>(cfg_.device);
    host_grad_fresh_.assign(np, true);
  }
  build_buffers(named);
  install_hooks(model);
}

ZeroEngine::~ZeroEngine() {
  for (auto& [i, id] : param_hooks_) Tensor(named_[size_t(i)].second).remove_grad_ready_hook(id);
  for (auto& [m, id] : module_hooks_) m->remove_hook(id);
  // Collectives still in flight (an exception mid-backward) must not outlive the buffers they use.
  for (auto& f : in_flight_)
    if (f.work) try {
        f.work->wait();
      } catch (...) {
      }
  for (auto& w : gather_work_)
    if (w) try {
        w->wait();
      } catch (...) {
      }
  for (auto& w : param_gather_)
    if (w) try {
        w->wait();
      } catch (...) {
      }
  worker_.reset();  // drains: its jobs use the buffers below
}

void ZeroEngine::build_buffers(const std::vector<std::pair<std::string, Tensor>>& named) {
  named_ = named;
  const Device dev = cfg_.device;
  const bool mixed = cfg_.compute_dtype != DType::f32;
  FlatParams flat = flatten_parameters(named_, layout_.flat);
  // Every rank starts from rank 0's weights.
  if (comm_) comm_->broadcast(flat.params, 0)->wait();
  NoGradGuard no_grad;
  auto my_chunks = [&](const Tensor& full) {
    Tensor out = empty({layout_.shard_numel()}, full.dtype(), dev);
    for (size_t p = 0; p < layout_.partitions.size(); ++p) {
      const ShardRange r = layout_.chunk_range(p, shard_rank_);
      out.narrow(0, layout_.local_offset(p), r.numel()).copy_(full.narrow(0, r.begin, r.numel()));
    }
    return out;
  };
  const bool offload = cfg_.offload;
  const Tensor chunks = cfg_.stage == 3 || mixed || offload ? my_chunks(flat.params) : Tensor();
  if (offload) {
    master_ = empty_pinned({layout_.shard_numel()}, DType::f32);
    master_.copy_(chunks);
  } else if (mixed) {
    master_ = chunks;
  }
  if (cfg_.stage <= 2) {
    params_ = mixed ? flat.params.to(cfg_.compute_dtype) : flat.params;
    if (mixed) bind_parameters(named_, layout_.flat, params_);
  } else {
    param_shard_ = mixed ? chunks.to(cfg_.compute_dtype) : chunks;
    for (size_t p = 0; p < layout_.partitions.size(); ++p) {
      const Partition& part = layout_.partitions[p];
      gathered_[p] = empty({part.numel}, cfg_.compute_dtype, dev);
      for (size_t i = part.first_param; i < part.end_param; ++i)
        repoint_parameter(named_[i].second, gathered_[p], layout_.flat.segments[i].offset - part.begin);
      gathered_[p].storage()->release();
      gather_state_[p] = Gather::released;
    }
  }
  if (cfg_.stage <= 1) {
    grads_ = mixed ? zeros({layout_.flat.numel}, cfg_.compute_dtype, dev) : flat.grads;
    for (size_t i = 0; i < named_.size(); ++i) {
      const FlatSegment& s = layout_.flat.segments[i];
      Tensor(named_[i].second).set_grad(view_of_storage(grads_, s.shape, grads_.offset() + s.offset));
    }
  } else {
    for (auto& [name, p] : named_) Tensor(p).set_grad(Tensor());
  }
  if (offload) {
    grad_shard_ = empty_pinned({layout_.shard_numel()}, DType::f32);
    grad_shard_.zero_();
  } else if (cfg_.stage >= 2 || mixed) {
    grad_shard_ = zeros({layout_.shard_numel()}, DType::f32, dev);
  }

  const auto ranges = layout_.ranges(shard_rank_);
  const Device opt_dev = offload ? Device::cpu() : dev;
  const auto hyper = timm_weight_decay(layout_.flat, cfg_.weight_decay);
  if (cfg_.optimizer == "sgd") {
    SgdConfig sc;
    sc.momentum = cfg_.momentum;
    optimizer_ = std::make_unique<Sgd>(layout_.flat, ranges, hyper, sc, DType::f32, opt_dev, offload);
  } else {
    CZ_CHECK(cfg_.optimizer == "adamw", "ZeRO: unknown optimizer '{}' (adamw or sgd)", cfg_.optimizer);
    optimizer_ =
        std::make_unique<AdamW>(layout_.flat, ranges, hyper, AdamWConfig{}, DType::f32, opt_dev, offload);
  }
  if (cfg_.ema_decay > 0) {
    const auto w = master_params();
    ema_ = std::make_unique<WeightEma>(std::span<const Tensor>(w), cfg_.ema_decay);
  }
}

void ZeroEngine::install_hooks(nn::Module& model) {
  for (size_t i = 0; i < named_.size(); ++i) {
    Tensor p = named_[i].second;
    param_hooks_.emplace_back(int(i),
                              p.register_grad_ready_hook([this, i](Tensor& t) { on_grad_ready(i, t); }));
  }
  if (cfg_.stage == 1 || cfg_.stage == 2) {
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < named_.size(); ++i) index[named_[i].first] = i;
    for (auto& [prefix, m] : model.named_modules()) {
      std::vector<size_t> parts;
      for (const auto& [local, t] : m->local_parameters()) {
        const size_t p = param_partition_[index.at(prefix.empty() ? local : prefix + "." + local)];
        if (std::find(parts.begin(), parts.end(), p) == parts.end()) parts.push_back(p);
      }
      if (parts.empty()) continue;
      module_hooks_.emplace_back(m, m->register_forward_pre_hook([this, parts](nn::Module&, const Tensor&) {
        wait_param_gathers(parts);
      }));
    }
    return;
  }
  if (cfg_.stage != 3) return;
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    nn::Module* m = model.find_module(layout_.partitions[p].name);
    CZ_CHECK(m != nullptr, "ZeRO-3: the model has no module '{}'", layout_.partitions[p].name);
    module_hooks_.emplace_back(
        m, m->register_forward_pre_hook([this, p](nn::Module&, const Tensor&) { on_unit_forward_pre(p); }));
    module_hooks_.emplace_back(
        m, m->register_forward_hook(
               [this, p](nn::Module&, const Tensor&, const Tensor&) { on_unit_forward_post(p); }));
    module_hooks_.emplace_back(
        m, m->register_backward_pre_hook([this, p](nn::Module&) { on_unit_backward_pre(p); }));
  }
}

// ---- gradients ----

void ZeroEngine::begin_step(double lr, double clip_grad, const LossScaler& scaler) {
  NoGradGuard no_grad;
  lr_ = lr;
  clip_grad_ = clip_grad;
  if (grads_.defined()) grads_.zero_();
  // Offload overwrites each host gradient chunk on its first arrival instead (the worker may still be
  // reading them for the previous step's delayed update).
  if (grad_shard_.defined() && !worker_) grad_shard_.zero_();
  if (worker_) {
    host_grad_fresh_.assign(host_grad_fresh_.size(), true);
    // Ranges are updated as their gradients arrive unless the step needs every gradient first (clipping, an
    // fp16 overflow check) or the update is delayed.
    eager_update_ = !cfg_.offload_overlap_step && clip_grad <= 0 && !scaler.enabled();
    copy_s_ = 0;
    optim_s_ = 0;
  }
  stats_ = ZeroStepStats{};
  step_works_.clear();  // evaluation's gathers since the last step
  step_waits_.clear();
  comm_buffer_now_ = 0;
  note_comm_buffers();
}

void ZeroEngine::on_grad_ready(size_t i, Tensor& param) {
  const size_t p = param_partition_[i];
  if (cfg_.stage >= 2) {
    NoGradGuard no_grad;
    const Partition& part = layout_.partitions[p];
    if (!buckets_[p].defined()) {
      buckets_[p] = zeros({part.numel}, cfg_.reduce_dtype, cfg_.device);
      comm_buffer_now_ += held_bytes(buckets_[p]);
      note_comm_buffers();
    }
    const FlatSegment& s = layout_.flat.segments[i];
    const Tensor g = param.grad();
    if (g.defined()) buckets_[p].narrow(0, s.offset - part.begin, s.numel).view(s.shape).copy_(g);
    param.set_grad(Tensor());
  } else if (!last_micro_) {
    return;  // stages 0-1 reduce the accumulated gradients once, on the last micro-step
  }
  if (--remaining_[p] == 0) launch_reduce(p);
}

void ZeroEngine::launch_reduce(size_t p) {
  NoGradGuard no_grad;
  const Partition& part = layout_.partitions[p];
  launched_[p] = true;
  Tensor buf;
  if (cfg_.stage >= 2) {
    if (!buckets_[p].defined()) {  // no gradient arrived: the partition's gradient is zero on this rank
      buckets_[p] = zeros({part.numel}, cfg_.reduce_dtype, cfg_.device);
      comm_buffer_now_ += held_bytes(buckets_[p]);
    }
    buf = buckets_[p];
  } else {
    buf = grads_.narrow(0, part.begin, part.numel);
    if (buf.dtype() != cfg_.reduce_dtype) {
      buf = buf.to(cfg_.reduce_dtype);
      comm_buffer_now_ += held_bytes(buf);
    }
  }
  note_comm_buffers();
  while (in_flight_.size() >= 2) finish_oldest();
  dist::WorkHandle w;
  const int64_t bytes = part.numel * int64_t(dtype_size(cfg_.reduce_dtype));
  if (comm_) {
    if (cfg_.stage == 0) {
      w = comm_->all_reduce(buf, dist::ReduceOp::avg);
      count_sent(bytes, 2);
    } else {
      Tensor mine = buf.narrow(0, rank_ * layout_.chunk(p), layout_.chunk(p));
      w = comm_->reduce_scatter(buf, mine, dist::ReduceOp::avg);
      count_sent(bytes, 1);
    }
  }
  in_flight_.push_back({p, std::move(w), buf});
  // Stage 3: the unit's parameters are not needed again until the next forward.
  if (cfg_.stage == 3) release(p);
}

void ZeroEngine::finish_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  wait(f.work);
  NoGradGuard no_grad;
  const size_t p = f.partition;
  const Partition& part = layout_.partitions[p];
  const int64_t c = layout_.chunk(p), own = shard_rank_ * c;
  const Tensor mine = f.buffer.narrow(0, own, c);  // this rank's reduced (averaged) chunk
  if (worker_) {
    offload_grad_chunk(p, mine, cfg_.stage >= 2 && !host_grad_fresh_[p]);
    host_grad_fresh_[p] = false;
  } else if (cfg_.stage >= 2) {
    grad_shard_.narrow(0, layout_.local_offset(p), c)
        .add_(mine.dtype() == DType::f32 ? mine : mine.to(DType::f32));
  } else if (f.buffer.dtype() != grads_.dtype()) {
    grads_.narrow(0, part.begin + own, c).copy_(mine);
  }
  if (cfg_.stage >= 2) {
    comm_buffer_now_ -= held_bytes(buckets_[p]);
    buckets_[p] = Tensor();
  } else if (f.buffer.dtype() != grads_.dtype()) {
    comm_buffer_now_ -= held_bytes(f.buffer);
  }
}

void ZeroEngine::wait(const dist::WorkHandle& w) {
  if (!w) return;
  const auto t0 = Clock::now();
  w->wait();
  const auto t1 = Clock::now();
  stats_.comm_wait_s += std::chrono::duration<double>(t1 - t0).count();
  step_waits_.emplace_back(t0, t1);
  step_works_.push_back(w);
}

// Note [Exposed communication]
// The host's time in wait() is not all communication: it also holds the hand-off to the communication
// thread, the wait behind collectives queued earlier, and both threads' wake-ups, which on an oversubscribed
// CPU (ranks x threads > cores) can take far longer than a small collective runs. Counting all of it as
// exposed made `1 - exposed / comm_s` as low as -1056% for a 4-block model at 2 ranks. So comm_exposed_s is
// the time during the host's waits in which one of the step's collectives was running (the waits intersected
// with the union of their run intervals). The waits do not overlap each other, so it is at most the measure
// of that union, which is at most comm_s: the hidden fraction 1 - comm_exposed_s / comm_s lies in [0, 1]. The
// rest of the waiting is comm_wait_s - comm_exposed_s. NCCL's collectives are timed on the device's clock and
// wait() does not block the host for them, so they add to comm_s and not to comm_exposed_s.
namespace {
double exposed_seconds(std::vector<std::pair<dist::Work::TimePoint, dist::Work::TimePoint>> runs,
                       const std::vector<std::pair<dist::Work::TimePoint, dist::Work::TimePoint>>& waits) {
  std::sort(runs.begin(), runs.end());
  std::vector<std::pair<dist::Work::TimePoint, dist::Work::TimePoint>> merged;  // disjoint, in order
  for (const auto& r : runs) {
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  double s = 0;
  for (const auto& [begin, end] : waits)
    for (const auto& [run_begin, run_end] : merged) {
      const auto from = std::max(begin, run_begin), to = std::min(end, run_end);
      if (from < to) s += std::chrono::duration<double>(to - from).count();
    }
  return s;
}
}  // namespace

// On the CPU the collectives are complete once waited for; NCCL's device-side part is timed by its events,
// read once they have passed (the step ends with a device sync anyway).
void ZeroEngine::collect_comm_times() {
  std::vector<std::pair<dist::Work::TimePoint, dist::Work::TimePoint>> runs;
  for (const auto& w : step_works_) {
    w->synchronize();
    stats_.comm_s += w->run_seconds();
    if (auto r = w->host_run_interval()) runs.push_back(*r);
  }
  stats_.comm_exposed_s += exposed_seconds(std::move(runs), step_waits_);
  step_works_.clear();
  step_waits_.clear();
}

void ZeroEngine::count_sent(int64_t bytes, int factor) {
  // Ring reduce-scatter and all-gather send (N-1)/N of the buffer from each rank; all-reduce is both.
  stats_.comm_bytes += int64_t(factor) * bytes * (world_ - 1) / world_;
}

void ZeroEngine::note_comm_buffers() {
  stats_.comm_buffer_bytes = std::max(stats_.comm_buffer_bytes, comm_buffer_now_ + gathered_bytes());
}

void ZeroEngine::backward(const Tensor& loss, bool last_micro_step) {
  last_micro_ = last_micro_step;
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    remaining_[p] = int(layout_.partitions[p].end_param - layout_.partitions[p].first_param);
    launched_[p] = false;
  }
  phase_ = Phase::backward;
  try {
    loss.backward();
  } catch (...) {
    phase_ = Phase::forward;
    throw;
  }
  phase_ = Phase::forward;
  recording_ = false;
  flush();
}

// Partitions some of whose parameters got no gradient in this pass are reduced now (every rank reaches here
// with the same set, since the graph has the same structure on every rank); then everything in flight ends.
void ZeroEngine::flush() {
  if (cfg_.stage >= 2 || last_micro_)
    for (size_t p = 0; p < layout_.partitions.size(); ++p)
      if (!launched_[p]) launch_reduce(p);
  while (!in_flight_.empty()) finish_oldest();
  if (cfg_.stage == 3)
    for (size_t p = 0; p < layout_.partitions.size(); ++p) release(p);
}

// ---- the step ----

std::vector<Tensor> ZeroEngine::master_params() const {
  std::vector<Tensor> out;
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    const int64_t c = layout_.chunk(p);
    if (master_.defined())
      out.push_back(master_.narrow(0, layout_.local_offset(p), c));
    else
      out.push_back(compute_chunk(p));
  }
  return out;
}

std::vector<Tensor> ZeroEngine::master_grads() const {
  std::vector<Tensor> out;
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    const int64_t c = layout_.chunk(p);
    if (cfg_.stage <= 1 && !grad_shard_.defined())
      out.push_back(grads_.narrow(0, layout_.chunk_range(p, shard_rank_).begin, c));
    else
      out.push_back(grad_shard_.narrow(0, layout_.local_offset(p), c));
  }
  return out;
}

Tensor ZeroEngine::compute_chunk(size_t p) const {
  const int64_t c = layout_.chunk(p);
  if (cfg_.stage == 3) return param_shard_.narrow(0, layout_.local_offset(p), c);
  return params_.narrow(0, layout_.chunk_range(p, shard_rank_).begin, c);
}

void ZeroEngine::wait_param_gathers(std::span<const size_t> partitions) {
  for (size_t p : partitions)
    if (param_gather_[p]) {
      wait(param_gather_[p]);
      param_gather_[p].reset();
    }
}

void ZeroEngine::wait_all_param_gathers() {
  for (size_t p = 0; p < param_gather_.size(); ++p)
    if (param_gather_[p]) {
      wait(param_gather_[p]);
      param_gather_[p].reset();
    }
}

ZeroStepStats ZeroEngine::step(LossScaler& scaler) {
  NoGradGuard no_grad;
  wait_all_param_gathers();  // a forward without some module (none in ConvNeXt) would leave one in flight
  if (worker_) {
    offload_step(scaler);
    collect_comm_times();
    return stats_;
  }
  const std::vector<Tensor> g = master_grads(), w = master_params();
  if (cfg_.stage <= 1 &&
      grad_shard_.defined())  // mixed precision: fp32 master gradients from the 16-bit ones
    for (size_t p = 0; p < g.size(); ++p)
      Tensor(g[p]).copy_(grads_.narrow(0, layout_.chunk_range(p, shard_rank_).begin, layout_.chunk(p)));
  if (prepare_gradients(g, scaler)) {
    optimizer_->step(std::span<const Tensor>(w), std::span<const Tensor>(g), lr_);
    if (ema_) ema_->update(std::span<const Tensor>(w), cfg_.ema_decay);
    refresh_compute();
  }
  collect_comm_times();
  return stats_;
}

bool ZeroEngine::prepare_gradients(const std::vector<Tensor>& g, LossScaler& scaler) {
  bool take = true;
  if (scaler.enabled()) {
    bool overflow = false;
    for (const Tensor& t : g) overflow = scaler.unscale_(t) || overflow;
    // Every rank must skip the same steps: any rank's overflow is everyone's.
    if (cfg_.stage > 0) overflow = all_reduce_scalar(overflow ? 1.0 : 0.0, false) > 0;
    take = scaler.update(overflow);
  }
  stats_.skipped = !take;
  stats_.grad_norm = global_grad_norm(g);
  if (take && clip_grad_ > 0) {
    const double coef = clip_coefficient(stats_.grad_norm, clip_grad_);
    for (const Tensor& t : g) scale_(t, coef);
  }
  return take;
}

double ZeroEngine::global_grad_norm(const std::vector<Tensor>& g) {
  Tensor sq;
  for (const Tensor& t : g) sq = sq.defined() ? add(sq, grad_sq_norm(t)) : grad_sq_norm(t);
  double total = sq.item();
  if (cfg_.stage > 0) total = all_reduce_scalar(total, false);
  return std::sqrt(total);
}

void ZeroEngine::refresh_compute() {
  NoGradGuard no_grad;
  if (master_.defined())
    for (size_t p = 0; p < layout_.partitions.size(); ++p)
      compute_chunk(p).copy_(master_.narrow(0, layout_.local_offset(p), layout_.chunk(p)));
  if ((cfg_.stage == 1 || cfg_.stage == 2) && comm_) {
    for (size_t p = 0; p < layout_.partitions.size(); ++p) {
      const Partition& part = layout_.partitions[p];
      Tensor full = params_.narrow(0, part.begin, part.numel);
      param_gather_[p] = comm_->all_gather(compute_chunk(p), full);
      count_sent(part.numel * int64_t(dtype_size(params_.dtype())), 1);
    }
  }
}

double ZeroEngine::all_reduce_scalar(double v, bool average) {
  if (!comm_) return v;
  // On the communicator's device: the NCCL backend takes CUDA buffers only.
  Tensor t = full({1}, v, DType::f64, cfg_.device);
  comm_->all_reduce(t, average ? dist::ReduceOp::avg : dist::ReduceOp::sum)->wait();
  return t.item();
}

void ZeroEngine::swap_ema() {
  CZ_CHECK(ema_ != nullptr, "ZeRO: swap_ema without --ema-decay");
  synchronize();
  const auto w = master_params();
  ema_->swap(std::span<const Tensor>(w));
  refresh_compute();
}

std::vector<std::pair<std::string, Tensor>> ZeroEngine::master_parameters() {
  NoGradGuard no_grad;
  synchronize();
  const auto w = master_params();
  Tensor full = zeros({layout_.flat.numel}, DType::f32, cfg_.device);
  std::vector<dist::WorkHandle> works;
  for (size_t p = 0; p < layout_.partitions.size(); ++p) {
    const Partition& part = layout_.partitions[p];
    Tensor dst = full.narrow(0, part.begin, part.numel);
    if (layout_.shards == 1 || !comm_) {
      dst.narrow(0, 0, layout_.chunk(p)).copy_(w[p]);
    } else {
      dst.narrow(0, rank_ * layout_.chunk(p), layout_.chunk(p)).copy_(w[p]);  // from the host under offload
      Tensor mine = dst.narrow(0, rank_ * layout_.chunk(p), layout_.chunk(p));
      works.push_back(comm_->all_gather(mine, dst));
    }
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
  auto chunks_of = [&](const Tensor& shard_buffer) {  // a buffer laid out like this rank's shard
    std::vector<OwnedChunk> v;
    for (size_t p = 0; p < layout_.partitions.size(); ++p)
      v.push_back({layout_.chunk_range(p, shard_rank_),
                   shard_buffer.narrow(0, layout_.local_offset(p), layout_.chunk(p))});
    return v;
  };
  std::vector<OwnedChunk> params;
  const auto w = master_params();
  for (size_t p = 0; p < w.size(); ++p) params.push_back({layout_.chunk_range(p, shard_rank_), w[p]});
  out.emplace_back("params", std::move(params));
  for (const auto& [name, t] : optimizer_->state())
    if (name != "step") out.emplace_back(name, chunks_of(t));
  if (ema_) out.emplace_back("ema", chunks_of(ema_->weights()));
  if (for_save && cfg_.stage == 0 &&
      rank_ != 0)  // rank 0 writes the replicated state; the others name the kinds
    for (auto& [kind, chunks] : out) chunks.clear();
  return out;
}

void ZeroEngine::after_load(int64_t optimizer_steps) {
  optimizer_->set_step_count(optimizer_steps);
  refresh_compute();
  wait_all_param_gathers();
}

namespace {
int64_t state_bytes(const Optimizer& opt) {
  int64_t n = 0;
  for (const auto& [name, t] : opt.state())
    if (name != "step") n += held_bytes(t);
  return n;
}
}  // namespace

int64_t ZeroEngine::model_state_bytes() const {
  int64_t n = held_bytes(params_) + held_bytes(grads_) + held_bytes(param_shard_);
  if (!worker_) n += held_bytes(grad_shard_) + held_bytes(master_) + state_bytes(*optimizer_);
  return n;
}

int64_t ZeroEngine::host_state_bytes() const {
  return worker_ ? held_bytes(grad_shard_) + held_bytes(master_) + state_bytes(*optimizer_) : 0;
}

int64_t ZeroEngine::ema_bytes() const {
  return ema_ ? held_bytes(ema_->weights()) : 0;
}

}  // namespace cz::zero
