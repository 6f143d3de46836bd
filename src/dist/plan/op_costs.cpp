// A training step op by op (op_costs.h): the model's walk (nn::ModelSpec::walk) through a sink that gives
// each op what its kernel must read and write at the least and its multiply-adds x 2, forward and backward.
#include "dist/plan/op_costs.h"

#include <algorithm>

namespace cz::plan {
namespace {

// Each op's forward cost goes to its module's forward list and its backward cost to the backward list, which
// runs in reverse: one op, its two costs, side by side.
class CostSink final : public nn::OpSink {
 public:
  CostSink(const nn::ModelSpec& model, double batch, double e) : model_(model), n_(batch), e_(e) {}
  std::vector<ModuleCost> out;

  void scope(const std::string&, int) override {}
  int module_begin(const std::string& module) override {
    out.push_back({module, {}, {}});
    return int(out.size()) - 1;
  }
  void module_end(int m) override {
    std::reverse(out[size_t(m)].backward.begin(), out[size_t(m)].backward.end());
  }
  // CheckpointBackward recomputes the module, runs its backward inside grad(), and hands every parameter
  // gradient back at the end, last parameter first.
  T checkpoint(const T& x, const std::function<T(const T&, nn::WalkOut)>& body, nn::WalkOut o) override {
    const T z = body(x, o);
    ModuleCost& mc = out.back();
    std::vector<OpCost> all = mc.forward;
    for (OpCost& op : mc.backward) {
      op.grads.clear();
      all.push_back(op);
    }
    for (const nn::ParamInfo& p : model_.parameters())
      if (p.unit == mc.module) all.back().grads.insert(all.back().grads.begin(), p.name);
    mc.backward = std::move(all);
    return z;
  }
  void retain(const T&) override {}
  void release(const T&) override {}
  void fork(const T&, int64_t rows, int64_t c) override {  // the residual's and the branch's gradients
    bwd("grad accumulate", OpClass::memory, double(rows * c), 3.0 * double(rows * c));
  }

  T patchify(const T&, int64_t side, int64_t cin, int64_t cout, int64_t k, bool x_grad,
             const std::string& module, nn::WalkOut) override {
    const double so = double(side / k), rows = n_ * so * so, c = double(cout), kk = double(k * k * cin);
    const double in = n_ * double(side * side * cin), g = x_grad ? 2 : 1;
    fwd("patchify_conv2d", OpClass::matmul, 2 * rows * c * kk, in + rows * c + kk * c);
    bwd("PatchifyConv2dBackward", OpClass::matmul, 2 * g * rows * c * kk, g * in + rows * c + g * kk * c, 0,
        wb(module));
    return {};
  }
  T depthwise(const T&, int64_t side, int64_t c, int64_t k, const std::string& module, nn::WalkOut) override {
    const double rc = n_ * double(side * side * c), k2 = double(k * k);
    fwd("depthwise_conv2d", OpClass::depthwise, 2 * k2 * rc, 2 * rc);
    bwd("DepthwiseConv2dBackward", OpClass::depthwise, 4 * k2 * rc, 4 * rc, 0, wb(module));
    return {};
  }
  // A normalization (nn::NormOp) costs what its description says; its time scales with its bytes.
  T norm(const T&, const nn::NormOp& op, const std::string& module, nn::WalkOut) override {
    fwd(op.name, OpClass::memory, op.forward.flops, op.forward.elements, op.forward.extra_bytes);
    bwd(op.backward_name, OpClass::memory, op.backward.flops, op.backward.elements, op.backward.extra_bytes,
        wb(module));
    return {};
  }
  T linear(const T&, int64_t rows, int64_t in, int64_t out_f, const std::string& module,
           nn::WalkOut) override {
    const double r = double(rows), i = double(in), o = double(out_f);
    fwd("linear", OpClass::matmul, 2 * r * i * o, r * (i + o) + i * o);
    bwd("LinearBackward", OpClass::matmul, 4 * r * i * o, r * (2 * i + o) + 2 * i * o, 0, wb(module));
    return {};
  }
  T linear_gelu(const T&, int64_t rows, int64_t in, int64_t out_f, const std::string& module,
                nn::WalkOut) override {
    const double r = double(rows), i = double(in), o = double(out_f);
    fwd("linear_gelu", OpClass::matmul, 2 * r * i * o + 10 * r * o, r * (i + 2 * o) + i * o);
    bwd("LinearGeluBackward", OpClass::matmul, 4 * r * i * o + 15 * r * o, r * (2 * i + 3 * o) + 2 * i * o, 0,
        wb(module));
    return {};
  }
  T linear_scale_residual(const T&, const T&, int64_t rows, int64_t in, int64_t out_f,
                          const std::string& module, const std::string& gamma, nn::WalkOut) override {
    const double r = double(rows), i = double(in), o = double(out_f);
    fwd("linear_scale_residual", OpClass::matmul, 2 * r * i * o + 2 * r * o, r * (i + 3 * o) + i * o);
    bwd("LinearScaleResidualBackward", OpClass::matmul, 4 * r * i * o + 3 * r * o,
        r * (2 * i + 3 * o) + 2 * i * o, 0, {gamma, module + ".bias", module + ".weight"});
    return {};
  }
  // Note [The MLP on one tile]: reads x and the residual, writes the pre-activation, fc2's output and the
  // block's; backward recomputes GELU from the pre-activation, reads g, fc2's output, the pre-activation and
  // x, writes dx.
  T mlp_scale_residual(const T&, const T&, int64_t rows, int64_t c, int64_t hidden, const std::string& mlp,
                       const std::string& gamma, nn::WalkOut) override {
    const double r = double(rows), ch = double(c), h = double(hidden);
    fwd("mlp_scale_residual", OpClass::matmul, 4 * r * ch * h + 10 * r * h + 2 * r * ch,
        r * (4 * ch + h) + 2 * ch * h);
    bwd("MlpScaleResidualBackward", OpClass::matmul, 8 * r * ch * h + 25 * r * h + 3 * r * ch,
        r * (4 * ch + h) + 4 * ch * h, 0,
        {gamma, mlp + ".fc2.bias", mlp + ".fc2.weight", mlp + ".fc1.bias", mlp + ".fc1.weight"});
    return {};
  }
  T channel_scale(const T&, int64_t rows, int64_t c, const std::string& gamma, nn::WalkOut) override {
    const double rc = double(rows * c);
    fwd("channel_scale", OpClass::memory, rc, 2 * rc);
    bwd("ChannelScaleBackward", OpClass::memory, 2 * rc, 3 * rc, 0, {gamma});
    return {};
  }
  T drop_path(const T&, int64_t rows, int64_t c, nn::WalkOut) override {
    const double rc = double(rows * c);
    fwd("drop_path", OpClass::memory, rc, 2 * rc);
    bwd("DropPathBackward", OpClass::memory, rc, 2 * rc);
    return {};
  }
  T add(const T&, const T&, int64_t rows, int64_t c, nn::WalkOut) override {  // backward passes g through
    fwd("add", OpClass::memory, double(rows * c), 3.0 * double(rows * c));
    return {};
  }
  T global_avg_pool(const T&, int64_t rows, int64_t c, nn::WalkOut) override {
    const double rc = double(rows * c), nc = n_ * double(c);
    fwd("global_avg_pool", OpClass::memory, rc, rc + nc);
    bwd("GlobalAvgPoolBackward", OpClass::memory, rc, rc + nc);
    return {};
  }

 private:
  // The weight and bias of `module` (bias first: its AccumulateGrad node was created last).
  static std::vector<std::string> wb(const std::string& module) {
    return {module + ".bias", module + ".weight"};
  }
  void fwd(const char* op, OpClass cls, double flops, double elems, double extra_bytes = 0) {
    out.back().forward.push_back({op, cls, flops, elems * e_ + extra_bytes, {}});
  }
  void bwd(const char* op, OpClass cls, double flops, double elems, double extra_bytes = 0,
           std::vector<std::string> grads = {}) {
    out.back().backward.push_back({op, cls, flops, elems * e_ + extra_bytes, std::move(grads)});
  }

  const nn::ModelSpec& model_;
  double n_, e_;
};

}  // namespace

std::vector<ModuleCost> step_work(const nn::ModelSpec& model, int64_t image, int64_t batch, DType compute,
                                  bool checkpointing, bool cuda) {
  CostSink sink(model, double(batch), double(dtype_size(compute)));
  model.walk(sink, {batch, image, cuda, checkpointing}, {}, nn::WalkOut::saved);
  // The loss (cross-entropy on f32 logits) is the last module's; its backward runs first.
  const double n = double(batch), k = double(model.num_classes());
  ModuleCost& last = sink.out.back();
  last.forward.push_back(
      {"cross_entropy", OpClass::memory, 8 * n * k, n * k * double(dtype_size(compute)) + 4 * n * k, {}});
  last.backward.insert(last.backward.begin(),
                       {"CrossEntropyBackward", OpClass::memory, 8 * n * k, 8 * n * k, {}});
  return std::move(sink.out);
}

OpCost optimizer_work(int64_t elements, bool mixed) {
  const double n = double(elements);
  return {"adamw_step", OpClass::memory, 20 * n, (mixed ? 40.0 : 28.0) * n, {}};
}

OpCost zero_grad_work(int64_t bytes) {
  return {"fill", OpClass::memory, 0, double(bytes), {}};
}

}  // namespace cz::plan
