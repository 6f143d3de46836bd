// ConvNeXt's step op by op (op_costs.h), mirroring nn::ConvNeXt's forward and the backward nodes of
// src/tensor/ops: what each kernel must read and write at the least, and its multiply-adds x 2.
#include "dist/plan/op_costs.h"

#include <fmt/format.h>

#include "tensor/ops/linear_fused.h"

namespace cz::plan {
namespace {

// Builds one module's ops; `e` bytes per activation element.
class Module {
 public:
  Module(std::string name, double e) : e_(e) { m_.module = std::move(name); }

  void fwd(const char* op, OpClass cls, double flops, double elems, double extra_bytes = 0) {
    m_.forward.push_back({op, cls, flops, elems * e_ + extra_bytes, {}});
  }
  void bwd(const char* op, OpClass cls, double flops, double elems, std::vector<std::string> grads = {},
           double extra_bytes = 0) {
    m_.backward.push_back({op, cls, flops, elems * e_ + extra_bytes, std::move(grads)});
  }
  // The weight and bias of `module` (bias first: its AccumulateGrad node was created last).
  static std::vector<std::string> wb(const std::string& module) {
    return {module + ".bias", module + ".weight"};
  }

  // rows x c activations.
  void layer_norm(double rows, double c) {
    fwd("layer_norm", OpClass::memory, 8 * rows * c, 2 * rows * c, 8 * rows);
  }
  void layer_norm_backward(double rows, double c, const std::string& module) {
    bwd("LayerNormBackward", OpClass::memory, 12 * rows * c, 3 * rows * c, wb(module), 8 * rows);
  }
  // rows x in -> rows x out.
  void linear(double rows, double in, double out) {
    fwd("linear", OpClass::matmul, 2 * rows * in * out, rows * (in + out) + in * out);
  }
  void linear_backward(double rows, double in, double out, const std::string& module) {
    bwd("LinearBackward", OpClass::matmul, 4 * rows * in * out, rows * (2 * in + out) + 2 * in * out,
        wb(module));
  }

  ModuleCost take() { return std::move(m_); }

 private:
  double e_;
  ModuleCost m_;
};

}  // namespace

std::vector<ModuleCost> convnext_step_work(const nn::ConvNeXtConfig& cfg, int64_t image, int64_t batch,
                                           DType compute, bool checkpointing, bool cuda) {
  cfg.validate();
  const double e = double(dtype_size(compute)), n = double(batch), k2 = double(cfg.kernel * cfg.kernel);
  std::vector<ModuleCost> out;

  // Stem: 4x4 patchify of the images, LayerNorm.
  double side = double(image / 4), c = double(cfg.dims[0]);
  {
    Module m("stem", e);
    const double rows = n * side * side, pixels = n * double(image * image) * double(cfg.in_chans);
    const double kk = 16.0 * double(cfg.in_chans);
    m.fwd("patchify_conv2d", OpClass::matmul, 2 * rows * c * kk, pixels + rows * c + kk * c);
    m.layer_norm(rows, c);
    m.layer_norm_backward(rows, c, "stem.1");
    m.bwd("PatchifyConv2dBackward", OpClass::matmul, 2 * rows * c * kk, pixels + rows * c + kk * c,
          Module::wb("stem.0"));
    out.push_back(m.take());
  }

  int64_t total_blocks = 0, block = 0;
  for (int64_t d : cfg.depths) total_blocks += d;
  for (size_t i = 0; i < cfg.depths.size(); ++i) {
    if (i > 0) {
      const std::string name = fmt::format("stages.{}.downsample", i);
      Module m(name, e);
      const double prev = c, prev_rows = n * side * side;
      side /= 2;
      c = double(cfg.dims[i]);
      const double rows = n * side * side, kk = 4 * prev;
      m.layer_norm(prev_rows, prev);
      m.fwd("patchify_conv2d", OpClass::matmul, 2 * rows * c * kk, prev_rows * prev + rows * c + kk * c);
      m.bwd("PatchifyConv2dBackward", OpClass::matmul, 4 * rows * c * kk,
            2 * prev_rows * prev + rows * c + 2 * kk * c, Module::wb(name + ".1"));
      m.layer_norm_backward(prev_rows, prev, name + ".0");
      out.push_back(m.take());
    }
    const double rows = n * side * side, rc = rows * c;
    for (int64_t j = 0; j < cfg.depths[i]; ++j, ++block) {
      const std::string name = fmt::format("stages.{}.blocks.{}", i, j);
      const double rate =
          total_blocks > 1 ? cfg.drop_path_rate * double(block) / double(total_blocks - 1) : 0.0;
      const bool gamma = cfg.layer_scale_init > 0;
      Module m(name, e);
      // Forward: dwconv -> LayerNorm -> fc1 + GELU -> fc2 + gamma + residual (Note [Fused epilogues on the
      // CPU]); with drop path, or without gamma, fc2 alone -> (gamma, drop path) + residual. A fused op's
      // epilogue rides on its GEMM: the flops and bytes of both, one matmul-class op.
      const bool one_op = rate <= 0 && gamma && mlp_as_one_op(cuda, int64_t(c), 4 * int64_t(c));
      const bool fused_fc2 = rate <= 0 && gamma;
      m.fwd("depthwise_conv2d", OpClass::depthwise, 2 * k2 * rc, 2 * rc);
      m.layer_norm(rows, c);
      if (one_op) {
        // Note [The MLP on one tile]: reads x and the residual, writes the pre-activation, fc2's output and
        // the block's.
        m.fwd("mlp_scale_residual", OpClass::matmul, 16 * rows * c * c + 42 * rc, 8 * rc + 8 * c * c);
      } else if (fused_fc2) {
        m.fwd("linear_gelu", OpClass::matmul, 8 * rows * c * c + 40 * rc, 9 * rc + 4 * c * c);
        m.fwd("linear_scale_residual", OpClass::matmul, 8 * rows * c * c + 2 * rc, 7 * rc + 4 * c * c);
      } else {
        m.fwd("linear_gelu", OpClass::matmul, 8 * rows * c * c + 40 * rc, 9 * rc + 4 * c * c);
        // GRN (V2) over the 4C hidden channels: the norms' pass reads it, the output pass reads and writes.
        if (cfg.grn) m.fwd("grn", OpClass::memory, 6 * 4 * rc, 3 * 4 * rc);
        m.linear(rows, 4 * c, c);
        if (rate > 0) {
          if (gamma) m.fwd("channel_scale", OpClass::memory, rc, 2 * rc);
          m.fwd("drop_path", OpClass::memory, rc, 2 * rc);
        }
        m.fwd("add", OpClass::memory, rc, 3 * rc);
      }
      ModuleCost fwd_only = m.take();
      // Backward, in the order the nodes run.
      Module b(name, e);
      if (one_op) {
        // GELU recomputed from the pre-activation; reads g, fc2's output, the pre-activation and x, writes
        // dx.
        const std::vector<std::string> w1 = Module::wb(name + ".mlp.fc1"), w2 = Module::wb(name + ".mlp.fc2");
        b.bwd("MlpScaleResidualBackward", OpClass::matmul, 32 * rows * c * c + 103 * rc, 8 * rc + 16 * c * c,
              {name + ".gamma", w2[0], w2[1], w1[0], w1[1]});
      } else if (fused_fc2) {
        const std::vector<std::string> wb = Module::wb(name + ".mlp.fc2");
        b.bwd("LinearScaleResidualBackward", OpClass::matmul, 16 * rows * c * c + 3 * rc, 11 * rc + 8 * c * c,
              {name + ".gamma", wb[0], wb[1]});
        b.bwd("LinearGeluBackward", OpClass::matmul, 16 * rows * c * c + 60 * rc, 14 * rc + 8 * c * c,
              Module::wb(name + ".mlp.fc1"));
      } else {
        if (rate > 0) {
          b.bwd("DropPathBackward", OpClass::memory, rc, 2 * rc);
          if (gamma) b.bwd("ChannelScaleBackward", OpClass::memory, 2 * rc, 3 * rc, {name + ".gamma"});
        }
        b.linear_backward(rows, 4 * c, c, name + ".mlp.fc2");
        // Reads the gradient and the input twice (the sums, then dx), writes dx.
        if (cfg.grn)
          b.bwd("GrnBackward", OpClass::memory, 12 * 4 * rc, 4 * 4 * rc, Module::wb(name + ".mlp.grn"));
        b.bwd("LinearGeluBackward", OpClass::matmul, 16 * rows * c * c + 60 * rc, 14 * rc + 8 * c * c,
              Module::wb(name + ".mlp.fc1"));
      }
      b.layer_norm_backward(rows, c, name + ".norm");
      b.bwd("DepthwiseConv2dBackward", OpClass::depthwise, 4 * k2 * rc, 4 * rc,
            Module::wb(name + ".conv_dw"));
      b.bwd("grad accumulate", OpClass::memory, rc, 3 * rc);  // the residual's and the branch's gradients
      ModuleCost mc = b.take();
      mc.forward = std::move(fwd_only.forward);
      if (checkpointing) {
        // CheckpointBackward recomputes the block, runs its backward inside grad(), and hands every
        // parameter gradient back at the end, last parameter first.
        std::vector<std::string> grads;
        std::vector<OpCost> all = mc.forward;
        for (OpCost& op : mc.backward) {
          grads.insert(grads.begin(), op.grads.begin(), op.grads.end());
          op.grads.clear();
          all.push_back(op);
        }
        std::vector<std::string> order;  // registration order, reversed
        if (gamma) order.push_back(name + ".gamma");
        for (const char* p : {".conv_dw", ".norm", ".mlp.fc1", ".mlp.grn", ".mlp.fc2"}) {
          if (!cfg.grn && std::string(p) == ".mlp.grn") continue;
          order.push_back(name + p + ".weight");
          order.push_back(name + p + ".bias");
        }
        all.back().grads.assign(order.rbegin(), order.rend());
        mc.backward = std::move(all);
      }
      out.push_back(std::move(mc));
    }
  }

  // Head: pool, LayerNorm, fc; the loss (cross-entropy on f32 logits).
  {
    Module m("head", e);
    const double rows = n * side * side, k = double(cfg.num_classes);
    m.fwd("global_avg_pool", OpClass::memory, rows * c, rows * c + n * c);
    m.layer_norm(n, c);
    m.linear(n, c, k);
    m.fwd("cross_entropy", OpClass::memory, 8 * n * k, n * k, 4 * n * k);
    m.bwd("CrossEntropyBackward", OpClass::memory, 8 * n * k, 0, {}, 8 * n * k);
    m.linear_backward(n, c, k, "head.fc");
    m.layer_norm_backward(n, c, "head.norm");
    m.bwd("GlobalAvgPoolBackward", OpClass::memory, rows * c, rows * c + n * c);
    out.push_back(m.take());
  }
  return out;
}

OpCost optimizer_work(int64_t elements, bool mixed) {
  const double n = double(elements);
  return {"adamw_step", OpClass::memory, 20 * n, (mixed ? 40.0 : 28.0) * n, {}};
}

OpCost zero_grad_work(int64_t bytes) {
  return {"fill", OpClass::memory, 0, double(bytes), {}};
}

}  // namespace cz::plan
