// Activation checkpointing as an autograd node that recomputes its segment in backward.
#include "tensor/autograd/checkpoint.h"

#include "tensor/autograd/engine.h"
#include "tensor/autograd/node.h"

namespace cz {
namespace {

class CheckpointBackward final : public Node {
 public:
  CheckpointBackward(SegmentFn fn, const std::vector<Tensor>& inputs, std::vector<Tensor> params,
                     Generator* rng)
      : fn_(std::move(fn)), params_(std::move(params)), rng_(rng) {
    for (const Tensor& t : inputs) {
      inputs_.emplace_back(t);
      input_requires_grad_.push_back(t.requires_grad());
    }
    if (rng_) {
      seed_ = rng_->seed();
      offset_ = rng_->offset();
    }
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    std::vector<Tensor> leaves;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Tensor t = inputs_[i].get().detach();
      if (input_requires_grad_[i]) t.set_requires_grad(true);
      leaves.push_back(t);
    }
    std::vector<Tensor> outputs;
    {
      EnableGradGuard grad_on;
      uint64_t seed = 0, offset = 0;
      if (rng_) {
        seed = rng_->seed();
        offset = rng_->offset();
        rng_->set_state(seed_, offset_);
      }
      outputs = fn_(leaves);
      if (rng_) rng_->set_state(seed, offset);
    }
    std::vector<Tensor> roots, seeds;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (!grad_outputs[i].defined() || !outputs[i].requires_grad()) continue;
      roots.push_back(outputs[i]);
      seeds.push_back(grad_outputs[i]);
    }
    std::vector<Tensor> wrt;
    std::vector<size_t> slot;  // edge index of each entry of wrt
    for (size_t i = 0; i < leaves.size(); ++i)
      if (needs_input_grad(i)) {
        wrt.push_back(leaves[i]);
        slot.push_back(i);
      }
    for (size_t i = 0; i < params_.size(); ++i)
      if (needs_input_grad(leaves.size() + i)) {
        wrt.push_back(params_[i]);
        slot.push_back(leaves.size() + i);
      }
    std::vector<Tensor> result(next_edges().size());
    if (roots.empty() || wrt.empty()) return result;
    std::vector<Tensor> grads = grad(roots, seeds, wrt);
    for (size_t k = 0; k < grads.size(); ++k) result[slot[k]] = std::move(grads[k]);
    return result;
  }

  std::string name() const override { return "CheckpointBackward"; }
  void release_saved() override {
    for (SavedTensor& s : inputs_) s.reset();
  }

 private:
  SegmentFn fn_;
  std::vector<SavedTensor> inputs_;
  std::vector<bool> input_requires_grad_;
  std::vector<Tensor> params_;
  Generator* rng_;
  uint64_t seed_ = 0, offset_ = 0;
};

}  // namespace

std::vector<Tensor> checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& params, Generator* rng) {
  bool record_it = GradMode::enabled();
  if (record_it) {
    record_it = false;
    for (const Tensor& t : inputs) record_it = record_it || t.requires_grad();
    for (const Tensor& p : params) {
      CZ_CHECK(p.is_leaf(), "checkpoint: params must be leaf tensors (parameters)");
      record_it = record_it || p.requires_grad();
    }
  }
  if (!record_it) return fn(inputs);

  auto node = std::make_shared<CheckpointBackward>(fn, inputs, params, rng);
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  std::vector<const Tensor*> edge_inputs;
  for (const Tensor& t : inputs) edge_inputs.push_back(&t);
  for (const Tensor& p : params) edge_inputs.push_back(&p);
  std::vector<Tensor*> outs;
  for (Tensor& t : outputs) {
    t = t.detach();  // results of a no-grad run carry no history; give them the checkpoint's
    outs.push_back(&t);
  }
  record(node, edge_inputs, outs);
  return outputs;
}

}  // namespace cz
