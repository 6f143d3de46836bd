// Module tree traversal, train/eval, and the hook machinery (Note [Module backward hooks]).
#include "nn/module.h"

#include <algorithm>

#include "tensor/autograd/callback.h"
#include "tensor/autograd/engine.h"

namespace cz::nn {

struct Module::BackwardState {
  int remaining = 0;
  bool fired = false;
};

Tensor Module::operator()(const Tensor& x) {
  for (const auto& [id, hook] : forward_pre_hooks_) hook(*this, x);
  Tensor input = x;
  if (!backward_hooks_.empty() && GradMode::enabled()) {
    arm_backward_hook(x);
    if (x.requires_grad()) {
      std::weak_ptr<BackwardState> state = backward_state_;
      std::weak_ptr<Module*> self = self_;
      input = with_backward_callback(x, [self, state] {
        auto alive = self.lock();
        auto s = state.lock();
        if (alive && s && s == (*alive)->backward_state_ && --s->remaining == 0) (*alive)->fire_backward_hooks();
      });
    }
  }
  Tensor out = forward(input);
  for (const auto& [id, hook] : forward_hooks_) hook(*this, x, out);
  if (!backward_pre_hooks_.empty()) {
    std::weak_ptr<Module*> self = self_;
    out = with_backward_callback(out, [self] {
      if (auto alive = self.lock())
        for (const auto& [id, hook] : (*alive)->backward_pre_hooks_) hook(**alive);
    });
  }
  return out;
}

void Module::arm_backward_hook(const Tensor& input) {
  const NamedParameters params = named_parameters();
  if (!param_hooks_installed_) {
    // Permanent grad-ready hooks that count down whichever pass is current.
    std::weak_ptr<Module*> self = self_;
    for (const auto& [name, p] : params) {
      if (!p.requires_grad()) continue;
      Tensor(p).register_grad_ready_hook([self](Tensor&) {
        auto alive = self.lock();
        if (!alive) return;
        Module* m = *alive;
        if (m->backward_state_ && !m->backward_state_->fired && --m->backward_state_->remaining == 0)
          m->fire_backward_hooks();
      });
    }
    param_hooks_installed_ = true;
  }
  auto state = std::make_shared<BackwardState>();
  for (const auto& [name, p] : params) state->remaining += p.requires_grad() ? 1 : 0;
  state->remaining += input.requires_grad() ? 1 : 0;
  backward_state_ = state;
}

void Module::fire_backward_hooks() {
  if (!backward_state_ || backward_state_->fired) return;
  backward_state_->fired = true;
  for (const auto& [id, hook] : backward_hooks_) hook(*this);
}

Tensor& Module::register_parameter(std::string name, Tensor t) {
  CZ_CHECK(t.defined(), "{}: parameter '{}' is undefined", type_name_, name);
  for (const auto& [n, p] : params_) CZ_CHECK(n != name, "{}: parameter '{}' registered twice", type_name_, name);
  t.set_requires_grad(true);
  t.set_name(name);
  params_.emplace_back(std::move(name), std::move(t));
  return params_.back().second;
}

void Module::collect_parameters(const std::string& prefix, NamedParameters& out) const {
  for (const auto& [name, p] : params_) out.emplace_back(prefix + name, p);
  for (const auto& [name, child] : children_) child->collect_parameters(prefix + name + ".", out);
}

NamedParameters Module::named_parameters() const {
  NamedParameters out;
  collect_parameters("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, p] : named_parameters()) n += p.numel();
  return n;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [name, child] : children_)
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  return out;
}

Module* Module::find_module(std::string_view dotted) {
  if (dotted.empty()) return this;
  const size_t dot = dotted.find('.');
  const std::string_view head = dotted.substr(0, dot);
  for (const auto& [name, child] : children_)
    if (name == head) return dot == std::string_view::npos ? child.get() : child->find_module(dotted.substr(dot + 1));
  return nullptr;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

int Module::register_forward_pre_hook(ForwardPreHook hook) {
  forward_pre_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}
int Module::register_forward_hook(ForwardHook hook) {
  forward_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}
int Module::register_backward_pre_hook(BackwardHook hook) {
  backward_pre_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}
int Module::register_backward_hook(BackwardHook hook) {
  backward_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void Module::remove_hook(int id) {
  auto drop = [id](auto& v) { std::erase_if(v, [id](const auto& h) { return h.first == id; }); };
  drop(forward_pre_hooks_);
  drop(forward_hooks_);
  drop(backward_pre_hooks_);
  drop(backward_hooks_);
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& [name, child] : children()) h = (*child)(h);
  return h;
}

ExecutionOrderRecorder::ExecutionOrderRecorder(Module& root) {
  for (auto& [name, m] : root.named_modules()) {
    const std::string n = name;
    hooks_.emplace_back(m, m->register_forward_pre_hook([this, n](Module&, const Tensor&) { order_.push_back(n); }));
  }
}

ExecutionOrderRecorder::~ExecutionOrderRecorder() {
  for (auto& [m, id] : hooks_) m->remove_hook(id);
}

}  // namespace cz::nn
