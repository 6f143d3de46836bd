// Autograd graph nodes. Every differentiable op that runs with grad mode on and an input that requires grad
// records one Node holding what its backward needs; edges point to the nodes of its inputs.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace cz {

struct Edge {
  std::shared_ptr<Node> fn;  // null: that input needs no gradient
  uint32_t input_nr = 0;     // which of fn's outputs (i.e. which grad_output slot of fn)
  bool valid() const { return fn != nullptr; }
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients w.r.t. this node's outputs (undefined where none arrived) -> gradients w.r.t. its inputs, one
  // per next edge (undefined where an edge needs none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Drops saved tensors once backward has used them (retain_graph = false).
  virtual void release_saved() {}

  const std::vector<Edge>& next_edges() const { return next_; }
  void set_next_edges(std::vector<Edge> edges) { next_ = std::move(edges); }
  bool needs_input_grad(size_t i) const { return i < next_.size() && next_[i].valid(); }
  uint32_t num_outputs() const { return num_outputs_; }
  void set_num_outputs(uint32_t n) { num_outputs_ = n; }
  // Creation order. The engine runs ready nodes highest first, i.e. in reverse order of the forward pass.
  uint64_t sequence_nr() const { return seq_; }

  // Hooks on the gradient arriving for output `output_nr`, run by the engine before apply().
  void add_pre_hook(uint32_t output_nr, GradHook hook) {
    pre_hooks_.emplace_back(output_nr, std::move(hook));
  }
  void run_pre_hooks(std::vector<Tensor>& grad_outputs) const;

 private:
  std::vector<std::pair<uint32_t, GradHook>> pre_hooks_;
  std::vector<Edge> next_;
  uint32_t num_outputs_ = 1;
  uint64_t seq_;
};

// The sink for a leaf's gradient: accumulates into `.grad` and then fires the leaf's grad-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) { set_num_outputs(1); }
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// A tensor saved for backward, with the storage version it had, so that an in-place write after saving is
// caught instead of silently producing wrong gradients.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // Throws if the tensor was modified in place since it was saved, or backward already freed it.
  Tensor get() const;
  void reset() {
    released_ = tensor_.defined();
    tensor_ = Tensor();
  }

 private:
  Tensor tensor_;  // detached: a saved output must not point back at the node that saved it
  uint64_t version_ = 0;
  bool released_ = false;
};

// Edge to `t`'s place in the graph: its grad_fn output, its AccumulateGrad if it is a leaf that requires
// grad, or an invalid edge.
Edge gradient_edge(const Tensor& t);
std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& leaf);

// True when grad mode is on and any of `inputs` (undefined ones allowed) requires grad: the op should record.
bool should_record(std::initializer_list<const Tensor*> inputs);
// Wires `outputs` to `node` if grad mode is on and any input requires grad; returns whether it did.
// Inputs may include undefined tensors (optional arguments), which get invalid edges.
bool record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs);

}  // namespace cz
