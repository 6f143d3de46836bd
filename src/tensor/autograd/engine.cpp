// The backward engine: dependency counting over the recorded graph, nodes run highest sequence number first.
#include "tensor/autograd/engine.h"

#include <optional>
#include <queue>
#include <unordered_map>

#include "tensor/autograd/node.h"
#include "tensor/profiler.h"

namespace cz {
namespace {
thread_local bool grad_mode_enabled = true;

struct NodeState {
  int dependencies = 0;
  std::vector<Tensor> inputs;  // gradients arriving for each of the node's outputs
};

struct BySequence {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

// Sum into a gradient slot. In place only when nobody else can see the slot's bytes.
void accumulate(Tensor& slot, Tensor g) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = std::move(g);
    return;
  }
  CZ_ASSERT(slot.sizes() == g.sizes(), "gradients {} and {} for one tensor", shape_str(slot.sizes()),
            shape_str(g.sizes()));
  profiler::Scope prof("grad accumulate", g.device());
  if (slot.impl_ptr().use_count() != 1 || slot.storage().use_count() != 1) slot = slot.clone();
  slot.add_(g);
}

// The device a node's work runs on, for the profiler: that of its first defined incoming gradient.
Device device_of(const std::vector<Tensor>& grads) {
  for (const Tensor& g : grads)
    if (g.defined()) return g.device();
  return Device::cpu();
}

// What a `grad()` call captures instead of accumulating: AccumulateGrad node -> index into the result.
using Captures = std::unordered_map<const Node*, size_t>;

// The roots' gradient edges with their seeds: `grads[i]`, or ones for a scalar root given none.
std::vector<std::pair<Edge, Tensor>> seed_edges(const std::vector<Tensor>& roots,
                                                const std::vector<Tensor>& grads) {
  CZ_CHECK(roots.size() == grads.size(), "backward: {} roots but {} gradients", roots.size(), grads.size());
  std::vector<std::pair<Edge, Tensor>> seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    CZ_CHECK(
        r.defined() && r.requires_grad(),
        "backward: root {} does not require grad (was it computed under NoGradGuard, or from tensors that "
        "do not require grad?)",
        i);
    Tensor g = grads[i];
    if (!g.defined()) {
      CZ_CHECK_SHAPE(r.numel() == 1, "backward: a gradient must be given for non-scalar root of shape {}",
                     shape_str(r.sizes()));
      g = ones(r.sizes(), r.dtype(), r.device());
    }
    CZ_CHECK_SHAPE(g.sizes() == r.sizes(), "backward: gradient shape {} does not match root shape {}",
                   shape_str(g.sizes()), shape_str(r.sizes()));
    seeds.emplace_back(gradient_edge(r), g);
  }
  return seeds;
}

// Every node reachable from the seeds, with the count of edges that lead into it.
std::unordered_map<Node*, NodeState> count_dependencies(const std::vector<std::pair<Edge, Tensor>>& seeds) {
  std::unordered_map<Node*, NodeState> state;
  std::vector<Node*> stack;
  for (auto& [edge, g] : seeds) {
    Node* n = edge.fn.get();
    if (!state.count(n)) {
      state[n];
      stack.push_back(n);
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      auto [it, inserted] = state.try_emplace(e.fn.get());
      ++it->second.dependencies;
      if (inserted) stack.push_back(e.fn.get());
    }
  }
  return state;
}

using ReadyQueue = std::priority_queue<Node*, std::vector<Node*>, BySequence>;

// Runs `node` on its gathered gradients (unless none is defined, and it is not a leaf's sink) and hands its
// outputs down its edges, queueing each next node whose last gradient has arrived.
void run_node(Node* node, std::unordered_map<Node*, NodeState>& state, ReadyQueue& ready,
              const Captures* captures, std::vector<Tensor>* captured) {
  NodeState& s = state[node];
  std::vector<Tensor> inputs = std::move(s.inputs);
  inputs.resize(node->num_outputs());
  node->run_pre_hooks(inputs);

  const bool is_leaf_sink = dynamic_cast<AccumulateGrad*>(node) != nullptr;
  std::vector<Tensor> outputs;
  if (is_leaf_sink && captures) {
    // grad(): hand the gradient back instead of touching `.grad` or firing hooks.
    auto it = captures->find(node);
    if (it != captures->end()) accumulate((*captured)[it->second], std::move(inputs[0]));
    return;
  }
  bool any_defined = false;
  for (const Tensor& g : inputs) any_defined = any_defined || g.defined();
  if (any_defined || is_leaf_sink) {
    std::optional<profiler::Scope> prof;
    // A backward node is timed for --profile and for --trace's compute lanes alike: the trace's GPU-busy
    // fraction sums the device lane, which held forward's kernels only while this asked for --profile.
    if (profiler::enabled() || trace::active()) prof.emplace(node->name(), device_of(inputs));
    outputs = node->apply(std::move(inputs));
    node->release_saved();
  }
  outputs.resize(node->next_edges().size());

  const auto& edges = node->next_edges();
  for (size_t i = 0; i < edges.size(); ++i) {
    if (!edges[i].valid()) continue;
    Node* next = edges[i].fn.get();
    NodeState& ns = state[next];
    if (ns.inputs.empty()) ns.inputs.resize(next->num_outputs());
    accumulate(ns.inputs[edges[i].input_nr], std::move(outputs[i]));
    if (--ns.dependencies == 0) {
      ready.push(next);
      ns.dependencies = -1;
    }
  }
}

void execute(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, const Captures* captures,
             std::vector<Tensor>* captured) {
  NoGradGuard no_grad;
  std::vector<std::pair<Edge, Tensor>> seeds = seed_edges(roots, grads);
  std::unordered_map<Node*, NodeState> state = count_dependencies(seeds);

  ReadyQueue ready;
  for (auto& [edge, g] : seeds) {
    NodeState& s = state[edge.fn.get()];
    s.inputs.resize(edge.fn->num_outputs());
    accumulate(s.inputs[edge.input_nr], std::move(g));
  }
  for (auto& [edge, g] : seeds) {
    Node* n = edge.fn.get();
    if (state[n].dependencies == 0 && !state[n].inputs.empty()) {
      ready.push(n);
      state[n].dependencies = -1;  // queued
    }
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    run_node(node, state, ready, captures, captured);
  }
}

}  // namespace

bool GradMode::enabled() {
  return grad_mode_enabled;
}
void GradMode::set_enabled(bool on) {
  grad_mode_enabled = on;
}

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  execute(roots, grads, nullptr, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                         const std::vector<Tensor>& inputs) {
  Captures captures;
  std::vector<std::shared_ptr<AccumulateGrad>> keep_alive;
  for (size_t i = 0; i < inputs.size(); ++i) {
    CZ_CHECK(inputs[i].defined() && inputs[i].is_leaf() && inputs[i].requires_grad(),
             "grad: input {} must be a leaf that requires grad", i);
    keep_alive.push_back(grad_accumulator(inputs[i]));
    captures[keep_alive.back().get()] = i;
  }
  std::vector<Tensor> result(inputs.size());
  execute(roots, grads, &captures, &result);
  return result;
}

}  // namespace cz
