// The module base: a tree of named parameters and children, train/eval mode, and forward/backward hooks.
// Parameter names are hierarchical and dotted like PyTorch's state dicts ("stages.1.blocks.0.conv_dw.weight").
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace cz::nn {

class Module;
using ForwardPreHook = std::function<void(Module& m, const Tensor& input)>;
using ForwardHook = std::function<void(Module& m, const Tensor& input, const Tensor& output)>;
using BackwardHook = std::function<void(Module& m)>;
using NamedParameters = std::vector<std::pair<std::string, Tensor>>;

// Note [Module backward hooks]: a backward-pre hook fires when the gradient w.r.t. the module's output arrives,
// before any of the module's backward ops run (ZeRO-3 gathers the module's parameters there). A backward hook
// fires once the module's backward is complete: the gradient w.r.t. its input has been computed (if the input
// requires grad) and every parameter of the module's subtree that requires grad has fired its grad-ready hook.
// Both assume the module runs once per forward pass (true of ConvNeXt); a module whose input needs no grad and
// that has no trainable parameters has no backward, so its backward hook never fires. Under activation
// checkpointing the forward hooks fire again during the recompute.
class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Runs the hooks around forward().
  Tensor operator()(const Tensor& x);
  virtual Tensor forward(const Tensor& x) = 0;

  const std::string& type_name() const { return type_name_; }

  // Parameters of this module and its descendants, registration order, with full dotted names.
  NamedParameters named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  // Parameters registered directly on this module, with local names.
  const NamedParameters& local_parameters() const { return params_; }
  // This module ("") and its descendants, pre-order, with dotted names.
  std::vector<std::pair<std::string, Module*>> named_modules();
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  Module* find_module(std::string_view dotted_name);  // nullptr when absent

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Hooks return an id for remove_hook.
  int register_forward_pre_hook(ForwardPreHook hook);
  int register_forward_hook(ForwardHook hook);
  int register_backward_pre_hook(BackwardHook hook);
  int register_backward_hook(BackwardHook hook);
  void remove_hook(int id);

 protected:
  // Makes `t` a leaf that requires grad and registers it under `name`.
  Tensor& register_parameter(std::string name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    children_.emplace_back(std::move(name), module);
    return module;
  }

 private:
  struct BackwardState;  // per forward pass: what must finish before the backward hook fires
  void collect_parameters(const std::string& prefix, NamedParameters& out) const;
  void arm_backward_hook(const Tensor& input);
  void fire_backward_hooks();

  std::string type_name_;
  NamedParameters params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;

  int next_hook_id_ = 0;
  std::vector<std::pair<int, ForwardPreHook>> forward_pre_hooks_;
  std::vector<std::pair<int, ForwardHook>> forward_hooks_;
  std::vector<std::pair<int, BackwardHook>> backward_pre_hooks_;
  std::vector<std::pair<int, BackwardHook>> backward_hooks_;
  std::shared_ptr<BackwardState> backward_state_;
  bool param_hooks_installed_ = false;
  // Parameters can outlive their module (an optimizer may hold them); hooks installed on them reach the module
  // only through this token, which dies with it.
  std::shared_ptr<Module*> self_ = std::make_shared<Module*>(this);
};

// Chains children named "0", "1", ... like torch.nn.Sequential.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  void append(std::shared_ptr<Module> m) { register_module(std::to_string(children().size()), std::move(m)); }
  Tensor forward(const Tensor& x) override;
};

// Records the dotted names of modules in the order their forward starts (ZeRO-3 prefetches by it). Must not
// outlive the module tree it watches.
class ExecutionOrderRecorder {
 public:
  explicit ExecutionOrderRecorder(Module& root);
  ~ExecutionOrderRecorder();
  ExecutionOrderRecorder(const ExecutionOrderRecorder&) = delete;
  ExecutionOrderRecorder& operator=(const ExecutionOrderRecorder&) = delete;
  const std::vector<std::string>& order() const { return order_; }
  void clear() { order_.clear(); }

 private:
  std::vector<std::pair<Module*, int>> hooks_;
  std::vector<std::string> order_;
};

}  // namespace cz::nn
