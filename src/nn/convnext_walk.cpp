// ConvNeXt as a ModelSpec (model.h): its parameters, units and parts from the config, and its training
// forward op by op, as ConvNeXt::forward, ConvNeXtStage::forward and ConvNeXtBlock::forward run it.
#include <fmt/format.h>

#include "nn/convnext.h"
#include "nn/norm_ops.h"
#include "tensor/ops/linear_fused.h"

namespace cz::nn {
namespace {

class ConvNeXtSpec final : public ModelSpec {
 public:
  explicit ConvNeXtSpec(const ConvNeXtConfig& cfg) : cfg_(cfg) {
    cfg_.validate();
    int64_t total = 0;
    for (int64_t d : cfg_.depths) total += d;
    for (int64_t i = 0; i < total; ++i)  // timm's linearly rising drop-path rates (ConvNeXt's constructor)
      rates_.push_back(total > 1 ? cfg_.drop_path_rate * double(i) / double(total - 1) : 0.0);
  }

  const std::string& name() const override { return cfg_.name; }
  int64_t in_chans() const override { return cfg_.in_chans; }
  int64_t num_classes() const override { return cfg_.num_classes; }
  int64_t stride() const override { return int64_t(4) << (cfg_.depths.size() - 1); }
  std::vector<ParamInfo> parameters() const override { return convnext_parameters(cfg_); }
  std::vector<std::string> parts() const override {
    std::vector<std::string> parts{"stem"};
    for (size_t i = 0; i < cfg_.depths.size(); ++i) parts.push_back(fmt::format("stages.{}", i));
    parts.emplace_back("head");
    return parts;
  }

  WalkTensor walk(OpSink& ops, const WalkShape& shape, const WalkTensor& images,
                  WalkOut logits_out) const override {
    const int64_t n = shape.batch;
    int64_t side = shape.image / 4;
    ops.scope("stem", 0);
    const int stem = ops.module_begin("stem");
    const WalkTensor s1 =
        ops.patchify(images, shape.image, cfg_.in_chans, cfg_.dims[0], 4, false, "stem.0", WalkOut::saved);
    const WalkTensor s2 =
        ops.norm(s1, layer_norm_op(n * side * side, cfg_.dims[0]), "stem.1", WalkOut::saved);
    ops.release(s1);
    ops.module_end(stem);
    WalkTensor h = s2;
    ops.retain(h);  // ConvNeXt::forward's temporary keeps the stem output until the head has run
    int64_t block = 0;
    for (size_t i = 0; i < cfg_.depths.size(); ++i) {
      const WalkTensor next = stage(ops, shape, int(i), h, side, block);
      ops.release(h);
      h = next;
    }
    // Head: pool (saves nothing), LayerNorm, fc.
    const int64_t c = cfg_.dims.back();
    ops.scope("head", int(cfg_.depths.size()) + 1);
    const int head = ops.module_begin("head");
    const WalkTensor pooled = ops.global_avg_pool(h, n * side * side, c, WalkOut::saved);
    const WalkTensor normed = ops.norm(pooled, layer_norm_op(n, c), "head.norm", WalkOut::saved);
    ops.release(pooled);
    const WalkTensor logits = ops.linear(normed, n, c, cfg_.num_classes, "head.fc", logits_out);
    ops.release(normed);
    ops.module_end(head);
    ops.release(h);   // the last stage's output: no node kept it
    ops.release(s2);  // ConvNeXt::forward's temporary
    return logits;
  }

 private:
  WalkTensor stage(OpSink& ops, const WalkShape& shape, int i, const WalkTensor& x, int64_t& side,
                   int64_t& block_index) const {
    const int64_t n = shape.batch, c = cfg_.dims[size_t(i)];
    const int part = i + 1;
    WalkTensor h = x;
    ops.retain(h);
    if (i > 0) {
      const std::string name = fmt::format("stages.{}.downsample", i);
      ops.scope(name, part);
      const int64_t prev = cfg_.dims[size_t(i) - 1];
      const int unit = ops.module_begin(name);
      const WalkTensor ln = ops.norm(x, layer_norm_op(n * side * side, prev), name + ".0", WalkOut::saved);
      const WalkTensor p = ops.patchify(ln, side, prev, c, 2, true, name + ".1", WalkOut::saved);
      ops.release(ln);
      ops.module_end(unit);
      ops.release(h);
      h = p;
      side /= 2;
    }
    const bool last_stage = size_t(i) + 1 == cfg_.depths.size();
    for (int64_t j = 0; j < cfg_.depths[size_t(i)]; ++j) {
      const std::string name = fmt::format("stages.{}.blocks.{}", i, j);
      ops.scope(name, part);
      // The network's last block output is only pooled (no node keeps it); others are the next op's input.
      const WalkOut out = last_stage && j + 1 == cfg_.depths[size_t(i)] ? WalkOut::transient : WalkOut::saved;
      const double rate = rates_[size_t(block_index++)];
      const int64_t s = side;
      const auto body = [this, &ops, name, s, c, rate, n, cuda = shape.cuda](const WalkTensor& in,
                                                                             WalkOut o) {
        const int unit = ops.module_begin(name);
        const WalkTensor z = this->block(ops, name, in, n, s, c, rate, cuda, o);
        ops.module_end(unit);
        return z;
      };
      const WalkTensor next = shape.checkpointing ? ops.checkpoint(h, body, out) : body(h, out);
      ops.release(h);
      h = next;
    }
    return h;
  }

  // ConvNeXtBlock::forward: dwconv -> LayerNorm -> linear_gelu (fc1) -> linear_scale_residual (fc2, gamma,
  // residual), or on the CPU with small weights mlp_scale_residual for all of the MLP; with drop path, or
  // without gamma, fc2 alone -> (gamma, drop path) + residual. A V2 block (no gamma) runs grn before fc2.
  WalkTensor block(OpSink& ops, const std::string& b, const WalkTensor& x, int64_t n, int64_t side, int64_t c,
                   double rate, bool cuda, WalkOut out) const {
    constexpr WalkOut kSaved = WalkOut::saved;
    const int64_t rows = n * side * side;
    ops.fork(x, rows, c);
    const WalkTensor y1 = ops.depthwise(x, side, c, cfg_.kernel, b + ".conv_dw", kSaved);
    const WalkTensor y2 = ops.norm(y1, layer_norm_op(rows, c), b + ".norm", kSaved);
    const bool gamma = cfg_.layer_scale_init > 0;
    if (rate <= 0 && gamma && mlp_as_one_op(cuda, c, 4 * c)) {
      const WalkTensor z = ops.mlp_scale_residual(x, y2, rows, c, 4 * c, b + ".mlp", b + ".gamma", out);
      ops.release(y2);  // the temporaries of its argument
      ops.release(y1);
      return z;
    }
    WalkTensor a = ops.linear_gelu(y2, rows, c, 4 * c, b + ".mlp.fc1", kSaved);
    ops.release(y2);  // the temporaries of linear_gelu's argument
    ops.release(y1);
    if (cfg_.grn) {
      const WalkTensor r = ops.norm(a, grn_op(n, rows, 4 * c), b + ".mlp.grn", kSaved);
      ops.release(a);
      a = r;
    }
    if (rate <= 0 && gamma) {
      const WalkTensor z = ops.linear_scale_residual(x, a, rows, 4 * c, c, b + ".mlp.fc2", b + ".gamma", out);
      ops.release(a);
      return z;
    }
    const WalkTensor y5 = ops.linear(a, rows, 4 * c, c, b + ".mlp.fc2", kSaved);
    ops.release(a);
    if (rate > 0) {  // training with drop path
      WalkTensor h = y5;
      if (gamma) {
        h = ops.channel_scale(y5, rows, c, b + ".gamma", WalkOut::transient);
        ops.release(y5);
      }
      const WalkTensor d = ops.drop_path(h, rows, c, WalkOut::transient);
      const WalkTensor z = ops.add(x, d, rows, c, out);
      ops.release(d);
      ops.release(h);
      return z;
    }
    const WalkTensor z = ops.add(x, y5, rows, c, out);
    ops.release(y5);
    return z;
  }

  ConvNeXtConfig cfg_;
  std::vector<double> rates_;
};

}  // namespace

std::shared_ptr<const ModelSpec> convnext_spec(const ConvNeXtConfig& cfg) {
  return std::make_shared<ConvNeXtSpec>(cfg);
}

}  // namespace cz::nn
