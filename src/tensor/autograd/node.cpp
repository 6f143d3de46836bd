// Graph nodes, leaf gradient accumulation and saved tensors.
#include "tensor/autograd/node.h"

#include "tensor/autograd/engine.h"

namespace cz {
namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}  // namespace

Node::Node() : seq_(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

void Node::run_pre_hooks(std::vector<Tensor>& grad_outputs) const {
  for (const auto& [slot, hook] : pre_hooks_) {
    if (slot >= grad_outputs.size() || !grad_outputs[slot].defined()) continue;
    Tensor replaced = hook(grad_outputs[slot]);
    if (replaced.defined()) grad_outputs[slot] = std::move(replaced);
  }
}

namespace {
// A gradient can become `.grad` without a copy when nothing else can see its bytes.
bool exclusively_owned(const Tensor& g) {
  return g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() &&
         g.offset() == 0;
}
}  // namespace

// Note [Deferred gradient zero]
// A training step zeroes the gradients and then adds each parameter's gradient into its .grad. Where .grad is
// a view into a flat buffer of the whole model (the ZeRO engine at stages 0-1), the zeroing is a fill pass
// over the buffer. defer_grad_zero() marks .grad as zero instead: the first gradient of the next backward is
// copied over it, later ones add, and grad() zeroes it first if it is read before any arrived, so every
// reader sees what the fill would have left. Whoever reads the buffer itself rather than .grad (the gradient
// reducer) zeroes the segments of parameters that got no gradient before reading (GradReducer::prepare).
// What it saves is the fill: at ConvNeXt-atto's CPU step (one thread, bench_train_step --profile) the 1.3 ms
// "fill" went, and the copies bypass the cache (Note [Streaming gradient copies] in tensor/cpu/basic.cpp).
// Used on the CPU only: a CUDA graph captures the copy or the add that ran at capture and would replay it
// for every micro-step.
std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  Tensor g = std::move(grad_outputs[0]);
  AutogradMeta& meta = leaf_->meta();
  for (const GradHook& hook : meta.grad_hooks) {
    if (!g.defined()) break;
    Tensor replaced = hook(g);
    if (replaced.defined()) g = std::move(replaced);
  }
  if (g.defined()) {
    CZ_ASSERT(g.sizes() == leaf_->sizes, "gradient {} for a leaf of shape {}", shape_str(g.sizes()),
              shape_str(leaf_->sizes));
    if (meta.grad && meta.grad_zero_deferred) {  // Note [Deferred gradient zero]
      Tensor(meta.grad).copy_streaming_(g);      // Note [Streaming gradient copies]
      meta.grad_zero_deferred = false;
    } else if (meta.grad) {
      Tensor(meta.grad).add_(g);
    } else if (exclusively_owned(g) && g.dtype() == leaf_->dtype) {
      meta.grad = g.impl_ptr();
    } else {
      Tensor copy = empty(leaf_->sizes, leaf_->dtype, leaf_->storage->device());
      copy.copy_(g);
      meta.grad = copy.impl_ptr();
    }
  }
  Tensor leaf(leaf_);
  // Copy: a hook may remove itself or register another.
  const auto hooks = meta.grad_ready_hooks;
  for (const auto& [id, hook] : hooks) hook(leaf);
  return {};
}

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  tensor_ = t.detach();
  version_ = t.storage()->version();
}

Tensor SavedTensor::get() const {
  if (!tensor_.defined()) {
    CZ_CHECK(!released_,
             "backward through a graph a second time: its saved tensors were freed after the first backward");
    return tensor_;
  }
  CZ_CHECK(tensor_.storage()->version() == version_,
           "a tensor saved for backward ({}) was modified in place afterwards (version {} -> {}); gradients "
           "would be wrong",
           tensor_.str(), version_, tensor_.storage()->version());
  return tensor_;
}

std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& meta = leaf.impl()->meta();
  CZ_ASSERT(!meta.grad_fn && meta.requires_grad, "grad_accumulator of a non-leaf or a tensor without grad");
  auto acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    meta.grad_accumulator = acc;
  }
  return acc;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  return {grad_accumulator(t), 0};
}

bool should_record(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

bool record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs) {
  if (!GradMode::enabled()) return false;
  bool any = false;
  for (const Tensor* t : inputs) any = any || (t && t->defined() && t->requires_grad());
  if (!any) return false;
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor* t : inputs) edges.push_back(t ? gradient_edge(*t) : Edge{});
  node->set_next_edges(std::move(edges));
  node->set_num_outputs(uint32_t(outputs.size()));
  for (size_t i = 0; i < outputs.size(); ++i) {
    AutogradMeta& meta = outputs[i]->impl()->meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = uint32_t(i);
  }
  return true;
}

}  // namespace cz
