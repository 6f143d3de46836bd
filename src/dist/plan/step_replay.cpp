// Note [What a step allocates]
// The walk below mirrors, op by op, what Trainer::step (train/trainer.cpp) and the ops it calls
// allocate through the device's caching allocator, and when each buffer is freed:
//  * Forward: every op allocates its output; a recorded op's autograd node keeps what its backward reads
//    (src/tensor/ops/*.cpp): depthwise conv its input and the weight in kernel layout (k, k, C); patchify
//    conv its input and the weight as (Cout, k, k, Cin); LayerNorm its input and f32 mean/rstd per row;
//    linear its input (the weight is a view of the flat buffer, no copy); linear_gelu its input and its
//    pre-activation; linear_scale_residual its input and its output before gamma; GELU its input;
//    residual_scale_add and channel_scale their scaled input; drop_path only its per-sample scale (N
//    elements, kept until the graph dies); add and global_avg_pool nothing; cross-entropy the logits, labels
//    and f32 log-sum-exp per row (with Mixup/CutMix the soft targets instead of the labels, and an f32 row
//    sum). What no node keeps is freed when the last C++ handle to it goes (e.g. a block's fc1
//    pre-activation, under no-grad, once linear_gelu returns; the last block's output after the head's
//    pooling).
//  * Activation checkpointing (ConvNeXtStage, src/tensor/autograd/checkpoint.cpp): a block runs under
//    no-grad and its CheckpointBackward node keeps only the block input. In backward the node recomputes the
//    block with grad (all of its saved tensors again), runs the block's backward inside grad(), which holds
//    the block's parameter gradients until it returns, and the input gradient is cloned once (the seed
//    gradient it accumulates into is shared with the outer engine, engine.cpp accumulate()).
//  * Backward (src/tensor/autograd/engine.cpp): nodes run in reverse creation order; a node allocates its
//    input gradients (and its parameters' gradients, which AccumulateGrad hands to the ZeRO engine's
//    grad-ready hook right after and then frees), its saved tensors are released after it ran, and the
//    gradient it received is freed at the end of its turn. A residual's gradient is passed through without a
//    copy and the block's second contribution is added into it in place, so one buffer carries the residual
//    stream's gradient through a stage.
//  * The ZeRO engine (Note [What the engine allocates] in engine_events.cpp): buckets, stage-3 gathered units
//    around each module's forward and backward, the ring's scratch, the step's scalars.
//  * Kernel workspaces through the allocator: on the CPU the patchify im2col buffer (forward and backward);
//    on CUDA the per-stream cuBLAS workspace, the cuDNN workspace grown at the patchify convolutions (Note
//    [The cuDNN workspace in the plan]) and the depthwise filter-gradient partials.
//  * Around the ops: on the CPU backend all of a step's micro-batches are taken from the loader first and
//    live until the step returns; the summed loss is read through an f64 copy (Tensor::item); the engine's
//    model_state_bytes() for the log makes the optimizer's step counter a new 8-byte tensor.
//
// Note [One step, two descriptions]
// So the step is described twice: by the code that runs, and by this walk. Why not plan by running the real
// step on a "meta" device, whose allocator is the MemoryEvents and whose kernels do nothing (as PyTorch's
// meta tensors give shapes)? Because the planner is asked about steps that cannot run where it runs: a CUDA
// step in bf16 (16-bit copies, cuBLAS/cuDNN workspaces, the driver's 2 MiB pages) on a CPU-only machine with
// no CUDA build; a rank of a world of 8 or 64 from one process, with no MPI and no peers for the engine's
// collectives; and xlarge at micro-batches of several hundred, a few dozen times over for the largest-batch
// search, in tens of milliseconds. A meta path would need a no-op variant of every kernel and of the CUDA
// backend's workspace choices, a fake communicator that still allocates what the ring does, and a fake
// loader: a second description again, spread through src/tensor, src/dist/comm and src/io instead of kept
// in one file. So the replay stays, and drift between the two is made impossible to miss instead:
// tests/dist/plan/test_step_events.cpp runs the real step on the CPU backend, for every row of
// tests/dist/plan/plan_cases.h (stages 0-3, 1, 2 and 4 ranks, checkpointing, accumulation, offload, EMA, a
// background checkpoint's copy), with the allocator's event log on (Note [Allocator event log]), and holds
// it to this walk's log (replay_step with log_events) request by request: the bytes of each request, and
// which blocks were returned before it. The first difference fails the test with the op as the walk names it
// ("stages.1.blocks.0 fc1 backward: linear input gradient") and as the profiler names it (LinearBackward),
// both sizes and a few requests either side. What it cannot hold: the CUDA backend (its allocator keeps no
// log, and nothing here runs it), and when a communicator's thread grows its ring scratch (its sizes are
// compared, not its moment: the walk grows it when the collective is launched, which is never later than
// the thread does, so the plan errs high there). Each communicator (a 2-D mesh has several, each with a
// thread) is compared on its own, by the label the walk tags its scratch with (TraceEvent::thread) and its
// thread goes by (dist::current_communicator): the threads' requests interleave as timing has it. A change
// to an op's temporaries is made in the op and in its walk row (step_walker_ops.cpp; for a normalization its
// nn::NormOp in src/nn/norm_ops.cpp), and the test says where the second one is missing.
#include "dist/plan/step_replay.h"

#include <algorithm>

#include "dist/plan/step_walker.h"
#include "optim/device_scalars.h"
#include "tensor/ops/linear_fused.h"

namespace cz::plan {
namespace walk {

void Walker::build() {
  // Trainer::build_model: each parameter is allocated, conv and linear weights drawn through an f64 host
  // tensor (random.cpp assign), then moved into the flat buffers; the freed blocks stay in the cache.
  std::vector<Id> params;
  const std::vector<nn::ParamInfo> list = s_.model->parameters();
  for (const nn::ParamInfo& p : list)
    params.push_back(m_.alloc(p.numel * 4, Use::state, "parameter before flattening"));
  if (!s_.cuda)
    for (const nn::ParamInfo& p : list)
      if (p.shape.size() >= 2) m_.release(m_.alloc(p.numel * 8, Use::transient, "f64 initial draws"));
  // The ZeroEngine constructor: the model state; at stages 2-3 the flat buffers flatten_parameters made are
  // dropped once the shards exist, and stage 3's unit buffers are allocated and released once.
  // Note [What each rank keeps] in step_plan.cpp.
  const zero::StepPlan& plan = s_.engine.plan;
  const int64_t flat = s_.engine.layout.flat.numel * 4;
  std::vector<Id> dropped;
  if (!plan.full_grads()) dropped.push_back(m_.alloc(flat, Use::transient, "flat gradients (build)"));
  if (!plan.full_params()) dropped.push_back(m_.alloc(flat, Use::transient, "flat parameters (build)"));
  // Offload copies this rank's chunks to the host through a device buffer (kept as an fp32 parameter shard).
  if (plan.offload() && (plan.full_params() || plan.mixed()))
    dropped.push_back(m_.alloc(s_.engine.layout.shard_numel() * 4, Use::transient, "own chunks (build)"));
  for (const StateBuffer& b : s_.state)
    if (!b.host) m_.alloc(b.bytes, Use::state, b.name.c_str());
  const size_t np = s_.engine.layout.partitions.size();
  const auto records = [&](size_t p) { return plan.gather_records_bytes(s_.engine.layout, p, false); };
  if (!plan.full_params()) {
    for (const zero::Partition& p : s_.engine.layout.partitions)
      m_.release(m_.alloc(p.numel * e_, Use::transient, "unit buffer (build)"));
    for (size_t p = 0; p < np; ++p)  // quantized: each unit's records buffer, released as the unit's
      if (const int64_t w = records(p)) m_.release(m_.alloc(w, Use::transient, "records (build)"));
  } else if (plan.chunk_gathers()) {
    // Quantized at stages 1-2: the constructor's first gather of the records (ChunkGatherer::gather_records).
    std::vector<Id> wires;
    for (size_t p = 0; p < np; ++p)
      if (const int64_t w = records(p)) wires.push_back(m_.alloc(w, Use::transient, "records (build)"));
    for (Id w : wires) m_.release(w);
  }
  for (Id p : params) m_.release(p);
  for (Id d : dropped) m_.release(d);
  if (s_.cuda) {
    m_.alloc(kCublasWorkspace, Use::workspace, "cuBLAS workspace");
    if (s_.compute == DType::f16) m_.alloc(4, Use::input, "fp16 loss scale (device scalar)");
    if (s_.device_scalars) {
      m_.alloc(optim_scalars::kSlots * 8, Use::input, "the optimizer's device scalars");
      m_.alloc(4, Use::input, "the update's overflow flag");
    }
  }
  for (int g = 0; g < s_.graphs; ++g) {  // in the input row: copies of a micro-batch's input
    m_.alloc(s_.micro_batch * s_.image_size * s_.image_size * s_.model->in_chans() *
                 int64_t(dtype_size(s_.compute)),
             Use::input, "CUDA graph's static images");
    m_.alloc(s_.micro_batch * (s_.soft_targets ? s_.model->num_classes() * 4 : 8), Use::input,
             "CUDA graph's static targets");
    m_.alloc(4, Use::input, "CUDA graph's loss");
  }
  // Note [Normalising on the device]: the loader's batches hold 8-bit pixels.
  const int64_t image = s_.micro_batch * s_.image_size * s_.image_size * s_.model->in_chans();
  for (int64_t b = 0; b < s_.prefetched_batches; ++b) {
    m_.alloc(image, Use::input, "prefetched pixels");
    m_.alloc(s_.micro_batch * 8, Use::input, "prefetched labels");
    if (s_.soft_targets)
      m_.alloc(s_.micro_batch * s_.model->num_classes() * 4, Use::input, "prefetched targets");
  }
  if (s_.checkpoint_copy_bytes > 0)  // an empty one (stage 0, ranks but 0) allocates nothing
    m_.alloc(s_.checkpoint_copy_bytes, Use::checkpoint, "checkpoint host copy (background save)");
}

void Walker::step() {
  // Trainer::step takes all of the step's micro-batches from the loader first; on the CPU backend they are
  // in the training allocator and live until the step returns. On CUDA they are host memory, and each
  // micro-step copies its own to the device (micro_step).
  n_ = s_.micro_batch;
  const int64_t pixels = n_ * s_.image_size * s_.image_size * s_.model->in_chans();
  scope_ = "batch";
  part_ = 0;
  at("load");
  std::vector<A> batches;  // images, labels (and soft targets, made after the batch's images) per micro-step
  const size_t per_batch = s_.soft_targets ? 3 : 2;
  if (!s_.cuda)
    for (int64_t a = 0; a < s_.grad_accum; ++a) {
      batches.push_back(buf(pixels, Use::input, "pixels (8-bit)"));
      batches.push_back(buf(n_ * 8, Use::input, "labels"));
      if (s_.soft_targets) batches.push_back(buf(n_ * s_.model->num_classes() * 4, Use::input, "targets"));
    }
  // The micro-steps' losses are summed on the device: the first one's loss is kept, later ones add into a
  // new scalar each.
  const int64_t micro_steps = std::min<int64_t>(s_.grad_accum, 2);
  // Note [Copying the next batch ahead]: on CUDA this step's first batch was copied to the device during the
  // previous step (none before the first), and lives as long as the step's batches.
  const Id ahead = std::exchange(ahead_, kNone);
  for (int64_t a = 0; a < micro_steps; ++a) {
    if (s_.cuda) {
      copied_ahead_ = a == 0 && ahead != kNone;
      micro_step(a + 1 == micro_steps, A{}, A{});
    } else {
      // The loss reads the labels, or the soft targets.
      micro_step(a + 1 == micro_steps, batches[per_batch * size_t(a)],
                 batches[per_batch * size_t(a + 1) - 1]);
    }
  }
  if (s_.cuda) {
    scope_ = "batch";
    at("next batch ahead");
    ahead_ = m_.alloc(pixels, Use::input, "pixels (8-bit, the next step's, copied ahead)");
  }
  scope_ = "optimizer";
  at("mean loss");
  // loss_sum.item(): Tensor::to_vector reads the f32 scalar through an f64 copy.
  m_.release(m_.alloc(8, Use::transient, "loss as f64 (item)"));
  engine_.all_reduce_scalar();
  at("grad norm");
  engine_.optimizer_step();
  // ZeroEngine::step ends with model_state_bytes() for the log, which without offload asks the optimizer
  // for its state(), whose "step" entry is made as a new 0-d i64 tensor each time.
  at("model state bytes");
  if (!s_.engine.plan.offload()) m_.release(m_.alloc(8, Use::transient, "optimizer step counter (state())"));
  m_.release(loss_sum_);  // a local of Trainer::step
  loss_sum_ = kNone;
  for (const A& b : batches) m_.release(b.id);
  if (ahead != kNone) m_.release(ahead);
}

// `cpu_pixels`, `cpu_labels`: the CPU backend's batch (step()); none on CUDA, where the micro-step copies its
// own.
void Walker::micro_step(bool last, const A& /*cpu_pixels: read by model_input*/, const A& cpu_labels) {
  n_ = s_.micro_batch;
  const nn::ModelSpec& model = *s_.model;
  const int64_t img = s_.image_size;
  scope_ = "batch";
  part_ = 0;
  at("to device");
  const auto [images, labels] = model_input(n_ * img * img * model.in_chans(), cpu_labels);
  // The model's forward (nn::ModelSpec::walk); its logits are kept by the loss in f32, else by nothing.
  const nn::WalkOut logits_out = s_.compute == DType::f32 ? nn::WalkOut::saved : nn::WalkOut::transient;
  A logits = model.walk(*this, {n_, img, s_.cuda, s_.checkpointing}, images, logits_out);
  const std::string head = scope_;  // the model's last scope: the loss is counted with it
  const Loss loss = loss_of(logits, labels, head);
  if (saved_end_of_forward.empty()) saved_end_of_forward = m_.now().saved_by_part;

  at("backward seed");
  engine_.backward_begin(last);
  slot(loss.scaled.id) = m_.alloc(4, Use::transient, "backward seed");
  run_backward(main_);
  scope_ = "backward";
  at("engine flush");
  engine_.backward_end();
  m_.release(loss.scaled.id);
  if (loss_sum_ == kNone) {
    m_.retain(loss.loss.id);
    loss_sum_ = loss.loss.id;
  } else {
    const Id sum = m_.alloc(4, Use::transient, "loss sum");
    m_.release(loss_sum_);
    loss_sum_ = sum;
  }
  // End of the micro-step: the locals and the graph go.
  m_.release(loss.loss.id);
  m_.release(logits.id);
  m_.release(images.id);
  m_.release(labels.id);
  destroy(main_);
}

// model_input(batch, device): the f32 images, and on CUDA the pixels copied to the device meanwhile (Note
// [Normalising on the device]); then .to(compute dtype). The labels (or soft targets): copied on CUDA; on the
// CPU .to(device) returns the same tensor.
std::pair<A, A> Walker::model_input(int64_t pixels, const A& cpu_labels) {
  A images = buf(pixels * 4, Use::input, "images");
  if (s_.cuda && !copied_ahead_) m_.release(buf(pixels, Use::input, "pixels (8-bit, on the device)").id);
  if (s_.compute != DType::f32) {
    const A half = buf(pixels * e_, Use::input, "images (16-bit)");
    m_.release(images.id);
    images = half;
  }
  A labels = cpu_labels;
  if (s_.cuda) {
    labels = s_.soft_targets ? buf(n_ * s_.model->num_classes() * 4, Use::input, "targets")
                             : buf(n_ * 8, Use::input, "labels");
  } else {
    m_.retain(labels.id);
  }
  return {images, labels};
}

// The loss of `logits`, its backward nodes recorded under `head`: .to(f32) under mixed precision (ToBackward
// keeps nothing; `logits` becomes the f32 copy), cross-entropy (keeping the logits, the labels or targets,
// the log-sum-exp and with soft targets their row sums), the loss scale.
Walker::Loss Walker::loss_of(A& logits, const A& labels, const std::string& head) {
  const int64_t k = s_.model->num_classes();
  if (s_.compute != DType::f32) {
    at("logits to f32");
    const A f = buf(n_ * k * 4, keep(), "logits (f32)");
    const A src = logits;
    record([=, this] {
      at(head, "logits to f32 backward");
      const Id g = take(f.id);
      deposit(src, m_.alloc(src.bytes, Use::transient, "logits gradient (16-bit)"));
      m_.release(g);
    });
    m_.release(logits.id);
    logits = f;
  }
  at("cross_entropy");
  const A loss = buf(4, keep(), "loss");
  const A lse = buf(n_ * 4, keep(), "log-sum-exp");
  const A row_sums = s_.soft_targets ? buf(n_ * 4, keep(), "targets' row sums") : A{};
  const A x = logits;
  m_.retain(x.id);
  m_.retain(labels.id);
  record([=, this] {
    at(head, "cross_entropy backward");
    const Id g = take(loss.id);
    const Id d = m_.alloc(x.bytes, Use::transient, "logits gradient");
    m_.release(x.id);
    m_.release(labels.id);
    m_.release(lse.id);
    if (row_sums.id != kNone) m_.release(row_sums.id);
    deposit(x, d);
    m_.release(g);
  });
  at("loss scale");
  const A scaled = buf(4, Use::transient, "scaled loss");
  record([=, this] {
    at(head, "loss scale backward");
    const Id g = take(scaled.id);
    deposit(loss, m_.alloc(4, Use::transient, "loss gradient"));
    m_.release(g);
  });
  return {loss, scaled};
}

// ConvNeXtStage::forward under checkpointing: the module's call runs under no-grad, its
// CheckpointBackward node keeping only the input, and in backward runs again with grad (nn::OpSink).
A Walker::checkpoint(const A& x, const std::function<A(const A&, nn::WalkOut)>& body, nn::WalkOut out) {
  m_.retain(x.id);  // CheckpointBackward keeps its input
  recording_ = false;
  const A z = body(x, out == nn::WalkOut::saved ? nn::WalkOut::held : out);  // under no-grad, hooks too
  recording_ = true;
  const std::string scope = scope_;
  const int part = part_;
  record([=, this] {
    at(scope, "checkpoint recompute");
    const Id g = take(z.id);
    Graph inner;
    Graph* outer = graph_;
    graph_ = &inner;
    saved_use_ = Use::transient;  // the recomputed activations belong to this backward step
    const std::string outer_scope = scope_;
    scope_ = scope;
    part_ = part;
    const A z2 = body(x, nn::WalkOut::transient);
    saved_use_ = Use::saved;
    graph_ = outer;
    m_.retain(g);  // grad()'s seed: the same tensor the outer engine holds
    slot(z2.id) = g;
    std::vector<std::pair<size_t, Id>> grads;
    captured_grads_ = &grads;
    shared_grad_ = g;
    run_backward(inner);
    shared_grad_ = kNone;
    captured_grads_ = nullptr;
    const Id dx = take(x.id);
    m_.release(z2.id);  // the recomputed output, and with it the inner graph
    destroy(inner);
    m_.release(x.id);  // release_saved
    deposit(x, dx);
    m_.release(g);
    // The module's parameters' AccumulateGrad nodes were created in their registration order when the
    // checkpoint was recorded: they run last parameter first.
    std::sort(grads.begin(), grads.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [i, pg] : grads) engine_.grad_ready(i, pg);
    scope_ = outer_scope;
  });
  return z;
}

int Walker::module_begin(const std::string& module) {
  const int unit = engine_.unit_of_module(module);
  if (unit >= 0) {
    at(module, "gather");
    engine_.forward_pre(unit);
  }
  engine_.chunk_forward_pre(module);  // stages 1-2
  return unit;
}

void Walker::module_end(int unit) {
  if (unit < 0) return;
  engine_.forward_post(unit);
  if (!recording_) return;
  const std::string scope = scope_;
  record([=, this] {
    at(scope, "gather for backward");
    engine_.backward_pre(unit);
  });
}

}  // namespace walk

StepReplay replay_step(const StepSpec& spec, int64_t capture_event, bool log_events) {
  CZ_CHECK(spec.model != nullptr, "planner: the step has no model");
  CZ_CHECK(spec.micro_batch > 0, "planner: micro-batch must be positive, got {}", spec.micro_batch);
  CZ_CHECK(spec.image_size >= spec.model->stride(),
           "planner: images of {} px are smaller than the network's stride {}", spec.image_size,
           spec.model->stride());
  const std::vector<std::string> parts = spec.model->parts();
  MemoryEvents m(int(parts.size()), spec.cuda ? walk::kCudaPage : 0);
  if (capture_event >= 0) m.capture_at(capture_event);
  StepReplay r;
  walk::Walker w(spec, m, r.labels);
  w.build();
  m.reset_peak();  // Trainer::step resets the peak; what the build left live is counted from there
  if (log_events) m.log_to(&r.events);
  for (int i = 0; i < std::max(spec.steps, 1); ++i) {
    r.step_begins.push_back(r.events.size());
    w.step();
  }
  m.log_to(nullptr);
  r.peak = m.peak();
  r.saved_end_of_forward = w.saved_end_of_forward;
  r.reserved_peak = m.reserved_peak();
  r.at_peak = m.captured();
  return r;
}

}  // namespace cz::plan
