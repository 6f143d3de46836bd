// The ops of the step walk (step_walker.h): what each op of src/tensor/ops and src/nn allocates in forward,
// what its autograd node keeps, and what its backward allocates and frees.
#include <algorithm>

#include "dist/plan/step_walker.h"

namespace cz::plan::walk {

// depthwise.cu filter_plan: partial sums per chunk of rows.
int64_t cudnn_patchify_workspace(int64_t input_bytes, int64_t output_bytes) {
  return input_bytes + output_bytes;
}

int64_t depthwise_filter_workspace(int64_t rows, int64_t c, int64_t k) {
  const int64_t per_chunk = k * k * c * 4, col_tiles = (c + 31) / 32;
  const int64_t cap = std::max<int64_t>(kDepthwiseFilterCap / std::max<int64_t>(per_chunk, 1), 1);
  const int64_t want = (kAssumedSmCount * 4 + col_tiles - 1) / col_tiles;
  int64_t chunks = std::clamp<int64_t>(want, 1, std::min<int64_t>({cap, std::max<int64_t>(rows, 1), 65535}));
  const int64_t rows_per_chunk = std::max<int64_t>((rows + chunks - 1) / chunks, 1);
  chunks = std::max<int64_t>((rows + rows_per_chunk - 1) / rows_per_chunk, 1);
  return chunks * per_chunk;
}

A Walker::depthwise(const A& x, int64_t side, int64_t c, int64_t k, const std::string& module,
                    nn::WalkOut o) {
  at("conv_dw");
  const Use out = use_of(o);
  const int64_t rows = n_ * side * side;
  const A wk = buf(k * k * c * e_, keep(), "depthwise weight (k, k, C)");
  const A y = buf(rows * c * e_, out, "conv_dw output");
  if (!recording_) {
    m_.release(wk.id);
    return y;
  }
  m_.retain(x.id);
  const std::string scope = scope_;
  record([=, this] {
    at(scope, "conv_dw backward");
    const Id g = take(y.id);
    const Id dx = m_.alloc(x.bytes, Use::transient, "conv_dw input gradient");
    const Id dwk = m_.alloc(wk.bytes, Use::transient, "conv_dw weight gradient (k, k, C)");
    const Id db = m_.alloc(c * e_, Use::transient, "conv_dw bias gradient");
    if (s_.cuda)
      m_.release(
          m_.alloc(depthwise_filter_workspace(n_ * side, c, k), Use::workspace, "depthwise filter partials"));
    const Id dw = m_.alloc(wk.bytes, Use::transient, "conv_dw weight gradient (C, 1, k, k)");
    m_.release(dwk);
    m_.release(x.id);
    m_.release(wk.id);
    deposit(x, dx);
    m_.release(g);
    param_grad(db, module + ".bias");
    param_grad(dw, module + ".weight");
  });
  return y;
}

A Walker::patchify(const A& x, int64_t side, int64_t cin, int64_t cout, int64_t k, bool x_grad,
                   const std::string& module, nn::WalkOut o) {
  at("patchify");
  const Use out = use_of(o);
  const int64_t so = side / k, m = n_ * so * so, kk = k * k * cin;
  const A wk = buf(cout * kk * e_, keep(), "patchify weight (Cout, k, k, Cin)");
  const A y = buf(m * cout * e_, out, "patchify output");
  if (!s_.cuda) m_.release(m_.alloc(m * kk * e_, Use::workspace, "im2col patches"));
  if (s_.cuda) cudnn_workspace(cudnn_patchify_workspace(x.bytes, y.bytes));
  if (!recording_) {
    m_.release(wk.id);
    return y;
  }
  m_.retain(x.id);
  const std::string scope = scope_;
  record([=, this] {
    at(scope, "patchify backward");
    const Id g = take(y.id);
    const Id dx = x_grad ? m_.alloc(x.bytes, Use::transient, "patchify input gradient") : kNone;
    const Id dwk = m_.alloc(wk.bytes, Use::transient, "patchify weight gradient (Cout, k, k, Cin)");
    const Id db = m_.alloc(cout * e_, Use::transient, "patchify bias gradient");
    if (!s_.cuda) m_.release(m_.alloc(m * kk * e_, Use::workspace, "im2col patches"));
    const Id dw = m_.alloc(wk.bytes, Use::transient, "patchify weight gradient (Cout, Cin, k, k)");
    m_.release(dwk);
    m_.release(x.id);
    m_.release(wk.id);
    if (dx != kNone) deposit(x, dx);
    m_.release(g);
    param_grad(db, module + ".bias");
    param_grad(dw, module + ".weight");
  });
  return y;
}

// A normalization (nn::NormOp): its output, then the buffers its description lists, which the node keeps
// beside its input.
A Walker::norm(const A& x, const nn::NormOp& op, const std::string& module, nn::WalkOut o) {
  at(op.name);
  const A y = buf(op.rows * op.c * e_, use_of(o), op.output);
  std::vector<Id> saved;
  for (const nn::NormOp::Saved& b : op.saved) saved.push_back(Id(buf(b.bytes, keep(), b.what).id));
  if (!recording_) {
    for (Id t : saved) m_.release(t);
    return y;
  }
  record_x_weight_bias(op.name, y, x, op.c * e_, op.c * e_, std::move(saved), module,
                       {op.input_grad, op.weight_grad, op.bias_grad});
  return y;
}

Walker::LinearGrads Walker::linear_grads(const A& x, int64_t in, int64_t out_f) {
  const Id dx = m_.alloc(x.bytes, Use::transient, "linear input gradient");
  const Id dw = m_.alloc(out_f * in * e_, Use::transient, "linear weight gradient");
  return {dx, dw, m_.alloc(out_f * e_, Use::transient, "linear bias gradient")};
}

void Walker::record_x_weight_bias(const std::string& op, const A& y, const A& x, int64_t w_bytes,
                                  int64_t b_bytes, std::vector<Id> saved, const std::string& module,
                                  GradNames n) {
  m_.retain(x.id);
  const std::string scope = scope_;
  record([=, this] {
    at(scope, (op + " backward").c_str());
    const Id g = take(y.id);
    const Id dx = m_.alloc(x.bytes, Use::transient, n.dx);
    const Id dw = m_.alloc(w_bytes, Use::transient, n.dw);
    const Id db = m_.alloc(b_bytes, Use::transient, n.db);
    m_.release(x.id);
    for (Id t : saved) m_.release(t);
    deposit(x, dx);
    m_.release(g);
    param_grad(db, module + ".bias");
    param_grad(dw, module + ".weight");
  });
}

A Walker::linear(const A& x, int64_t rows, int64_t in, int64_t out_f, const std::string& module,
                 nn::WalkOut o) {
  const char* name = module.ends_with("fc1") ? "fc1" : module.ends_with("fc2") ? "fc2" : "fc";
  at(name);
  const Use out = use_of(o);
  const A y = buf(rows * out_f * e_, out, "linear output");
  if (!recording_) return y;
  record_x_weight_bias(name, y, x, out_f * in * e_, out_f * e_, {}, module,
                       {"linear input gradient", "linear weight gradient", "linear bias gradient"});
  return y;
}

// Note [Fused epilogues on the CPU]: a linear layer and its epilogue as one op. The GEMM's output before the
// epilogue is the node's (fc1's pre-activation instead of GeluBackward's; fc2's output before gamma), the
// op's output the next op's; backward allocates the epilogue's input gradient (GELU's, or the branch's),
// gamma's where there is one, then linear's, and the residual r, where given, gets the incoming gradient
// itself. The node's inputs are (residual, x, weight, bias, gamma): gamma's gradient is handed over first.
A Walker::fused_linear(const FusedNames& n, const A& r, const A& x, int64_t rows, int64_t in, int64_t out_f,
                       const std::string& module, const std::string& gamma, nn::WalkOut o) {
  at(n.op);
  const A h = buf(rows * out_f * e_, keep(), n.inner);
  const A y = buf(h.bytes, use_of(o), n.output);
  if (!recording_) {
    m_.release(h.id);
    return y;
  }
  m_.retain(x.id);
  const std::string scope = scope_;
  record([=, this] {
    at(scope, (std::string(n.op) + " backward").c_str());
    const Id g = take(y.id);
    const Id gh = m_.alloc(h.bytes, Use::transient, n.inner_grad);
    const Id dgamma = gamma.empty() ? kNone : m_.alloc(out_f * e_, Use::transient, "gamma gradient");
    const LinearGrads d = linear_grads(x, in, out_f);
    m_.release(gh);
    m_.release(x.id);
    m_.release(h.id);
    pass_residual(r, g, x, d.dx);
    if (dgamma != kNone) param_grad(dgamma, gamma);
    linear_param_grads(d, module);
  });
  return y;
}

A Walker::linear_gelu(const A& x, int64_t rows, int64_t in, int64_t out_f, const std::string& module,
                      nn::WalkOut o) {
  return fused_linear({"fc1 + gelu", "fc1 pre-activation", "gelu output", "gelu input gradient"}, A{}, x,
                      rows, in, out_f, module, "", o);
}

A Walker::linear_scale_residual(const A& r, const A& x, int64_t rows, int64_t in, int64_t out_f,
                                const std::string& module, const std::string& gamma, nn::WalkOut o) {
  return fused_linear({"fc2 + residual_scale_add", "linear output", "block output", "block branch gradient"},
                      r, x, rows, in, out_f, module, gamma, o);
}

// Note [The MLP on one tile]: the pre-activation and fc2's output before gamma are the node's, kept only
// when it is recorded; the GELU output and the tiles' intermediates never reach the allocator. Backward hands
// the gradients over in the reverse order of the node's inputs (residual, x, fc1's weight and bias, fc2's,
// gamma).
A Walker::mlp_scale_residual(const A& r, const A& x, int64_t rows, int64_t c, int64_t hidden,
                             const std::string& mlp, const std::string& gamma, nn::WalkOut o) {
  at("mlp_scale_residual");
  const Use out = use_of(o);
  if (!recording_) return buf(rows * c * e_, out, "block output");
  const A h = buf(rows * hidden * e_, keep(), "fc1 pre-activation");
  const A y2 = buf(rows * c * e_, keep(), "fc2 output");
  const A z = buf(y2.bytes, out, "block output");
  m_.retain(x.id);
  const std::string scope = scope_;
  record([=, this] {
    at(scope, "mlp_scale_residual backward");
    const Id g = take(z.id);
    const Id dx = m_.alloc(x.bytes, Use::transient, "fc1 input gradient");
    const Id dw1 = m_.alloc(hidden * c * e_, Use::transient, "fc1 weight gradient");
    const Id db1 = m_.alloc(hidden * e_, Use::transient, "fc1 bias gradient");
    const Id dw2 = m_.alloc(c * hidden * e_, Use::transient, "fc2 weight gradient");
    const Id db2 = m_.alloc(c * e_, Use::transient, "fc2 bias gradient");
    const Id dgamma = m_.alloc(c * e_, Use::transient, "gamma gradient");
    m_.release(x.id);
    m_.release(h.id);
    m_.release(y2.id);
    pass_residual(r, g, x, dx);
    param_grad(dgamma, gamma);
    param_grad(db2, mlp + ".fc2.bias");
    param_grad(dw2, mlp + ".fc2.weight");
    param_grad(db1, mlp + ".fc1.bias");
    param_grad(dw1, mlp + ".fc1.weight");
  });
  return z;
}

A Walker::channel_scale(const A& h, int64_t /*rows*/, int64_t c, const std::string& gamma, nn::WalkOut o) {
  at("channel_scale");
  const A y = buf(h.bytes, use_of(o), "channel_scale output");
  if (!recording_) return y;
  m_.retain(h.id);
  const std::string scope = scope_;
  record([=, this] {
    at(scope, "channel_scale backward");
    const Id g = take(y.id);
    const Id dx = m_.alloc(h.bytes, Use::transient, "block branch gradient");
    const Id dgamma = m_.alloc(c * e_, Use::transient, "gamma gradient");
    m_.release(h.id);
    pass_residual(A{}, g, h, dx);
    param_grad(dgamma, gamma);
  });
  return y;
}

A Walker::drop_path(const A& x, int64_t /*rows*/, int64_t /*c*/, nn::WalkOut o) {
  at("drop_path");
  const Use out = use_of(o);
  // The per-sample scale: from_vector (f64, host) -> .to(dtype) -> .to(device).
  A scale;
  if (s_.cuda) {
    scale = buf(n_ * e_, keep(), "drop-path scale");
  } else {
    const Id f64 = m_.alloc(n_ * 8, Use::transient, "drop-path mask (f64)");
    scale = buf(n_ * e_, keep(), "drop-path scale");
    m_.release(f64);
  }
  const A y = buf(x.bytes, out, "drop_path output");
  if (!recording_) {
    m_.release(scale.id);
    return y;
  }
  graph_->held.push_back(scale.id);
  const std::string scope = scope_;
  record([=, this] {
    at(scope, "drop_path backward");
    const Id g = take(y.id);
    deposit(x, m_.alloc(x.bytes, Use::transient, "drop_path input gradient"));
    m_.release(g);
  });
  return y;
}

A Walker::add(const A& a, const A& b, int64_t /*rows*/, int64_t /*c*/, nn::WalkOut o) {
  at("add");
  const A y = buf(a.bytes, use_of(o), "block output");
  if (!recording_) return y;
  const std::string scope = scope_;
  record([=, this] {
    at(scope, "add backward");
    const Id g = take(y.id);
    m_.retain(g);  // both inputs get the incoming gradient itself
    m_.retain(g);
    deposit(a, g);
    deposit(b, g);
    m_.release(g);
  });
  return y;
}

A Walker::global_avg_pool(const A& x, int64_t /*rows*/, int64_t c, nn::WalkOut o) {
  at("global_avg_pool");
  const A y = buf(n_ * c * e_, use_of(o), "pooled");
  if (!recording_) return y;
  const std::string scope = scope_;
  record([=, this] {
    at(scope, "global_avg_pool backward");
    const Id g = take(y.id);
    deposit(x, m_.alloc(x.bytes, Use::transient, "last stage output gradient"));
    m_.release(g);
  });
  return y;
}

}  // namespace cz::plan::walk
