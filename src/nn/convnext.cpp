// ConvNeXt: variants, structure, initialisation, drop path and activation checkpointing.
#include "nn/convnext.h"

#include <algorithm>

#include "tensor/autograd/checkpoint.h"
#include "tensor/autograd/engine.h"
#include "tensor/ops.h"

namespace cz::nn {

namespace {
struct Variant {
  const char* name;  // V1 without its "convnext_" prefix (convnext_variant takes both), V2 with its own
  std::vector<int64_t> depths, dims;
  bool conv_mlp = false;
  bool grn = false;
};
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"atto", {2, 2, 6, 2}, {40, 80, 160, 320}, true},
      {"femto", {2, 2, 6, 2}, {48, 96, 192, 384}, true},
      {"pico", {2, 2, 6, 2}, {64, 128, 256, 512}, true},
      {"nano", {2, 2, 8, 2}, {80, 160, 320, 640}, true},
      {"tiny", {3, 3, 9, 3}, {96, 192, 384, 768}},
      {"small", {3, 3, 27, 3}, {96, 192, 384, 768}},
      {"base", {3, 3, 27, 3}, {128, 256, 512, 1024}},
      {"large", {3, 3, 27, 3}, {192, 384, 768, 1536}},
      {"xlarge", {3, 3, 27, 3}, {256, 512, 1024, 2048}},
      // timm's convnextv2_*: GRN, no layer scale; atto..nano with timm's 1x1-conv MLP, as V1's.
      {"convnextv2_atto", {2, 2, 6, 2}, {40, 80, 160, 320}, true, true},
      {"convnextv2_femto", {2, 2, 6, 2}, {48, 96, 192, 384}, true, true},
      {"convnextv2_pico", {2, 2, 6, 2}, {64, 128, 256, 512}, true, true},
      {"convnextv2_nano", {2, 2, 8, 2}, {80, 160, 320, 640}, true, true},
      {"convnextv2_tiny", {3, 3, 9, 3}, {96, 192, 384, 768}, false, true},
      {"convnextv2_small", {3, 3, 27, 3}, {96, 192, 384, 768}, false, true},
      {"convnextv2_base", {3, 3, 27, 3}, {128, 256, 512, 1024}, false, true},
      {"convnextv2_large", {3, 3, 27, 3}, {192, 384, 768, 1536}, false, true},
      {"convnextv2_huge", {3, 3, 27, 3}, {352, 704, 1408, 2816}, false, true},
  };
  return v;
}

// Sequential with one named-by-index child per entry, for timm's "mlp" (fc1, act, fc2) we need names instead.
class NamedSequential : public Sequential {
 public:
  void add(std::string name, std::shared_ptr<Module> m) { register_module(std::move(name), std::move(m)); }
};
}  // namespace

std::vector<std::string> convnext_variant_names() {
  std::vector<std::string> names;
  for (const Variant& v : variants()) names.push_back(v.name);
  return names;
}

int64_t convnext_forward_macs(const ConvNeXtConfig& cfg, int64_t image) {
  cfg.validate();
  CZ_CHECK(image >= 4, "convnext_forward_macs: image must be at least 4 pixels, got {}", image);
  int64_t side = image / 4;  // the stem: 4x4 patches, stride 4 (the remainder is dropped)
  int64_t macs = side * side * cfg.dims[0] * (16 * cfg.in_chans);
  for (size_t i = 0; i < cfg.dims.size(); ++i) {
    const int64_t c = cfg.dims[i];
    if (i > 0) {  // 2x2, stride 2 downsampling from the previous stage's width
      side /= 2;
      macs += side * side * c * (4 * cfg.dims[i - 1]);
    }
    const int64_t pixels = side * side;
    // A block: depthwise k x k (padding keeps the size), fc1 C -> 4C, fc2 4C -> C.
    macs += cfg.depths[i] * (pixels * c * cfg.kernel * cfg.kernel + 2 * pixels * c * 4 * c);
  }
  return macs + cfg.dims.back() * cfg.num_classes;
}

std::vector<ParamInfo> convnext_parameters(const ConvNeXtConfig& cfg) {
  cfg.validate();
  std::vector<ParamInfo> p;
  auto add = [&p](std::string name, Shape shape, const std::string& unit) {
    p.push_back({std::move(name), shape, shape_numel(shape), unit});
  };
  const int64_t c0 = cfg.dims[0], k = cfg.kernel;
  add("stem.0.weight", {c0, cfg.in_chans, 4, 4}, "stem");
  add("stem.0.bias", {c0}, "stem");
  add("stem.1.weight", {c0}, "stem");
  add("stem.1.bias", {c0}, "stem");
  for (size_t i = 0; i < cfg.depths.size(); ++i) {
    const int64_t c = cfg.dims[i];
    const std::string stage = fmt::format("stages.{}.", i);
    if (i > 0) {
      const int64_t prev = cfg.dims[i - 1];
      const std::string unit = stage + "downsample";
      add(unit + ".0.weight", {prev}, unit);
      add(unit + ".0.bias", {prev}, unit);
      add(unit + ".1.weight", {c, prev, 2, 2}, unit);
      add(unit + ".1.bias", {c}, unit);
    }
    for (int64_t j = 0; j < cfg.depths[i]; ++j) {
      const std::string unit = fmt::format("{}blocks.{}", stage, j), b = unit + ".";
      if (cfg.layer_scale_init > 0) add(b + "gamma", {c}, unit);  // the block's own parameter comes first
      add(b + "conv_dw.weight", {c, 1, k, k}, unit);
      add(b + "conv_dw.bias", {c}, unit);
      add(b + "norm.weight", {c}, unit);
      add(b + "norm.bias", {c}, unit);
      add(b + "mlp.fc1.weight", {4 * c, c}, unit);
      add(b + "mlp.fc1.bias", {4 * c}, unit);
      if (cfg.grn) {
        add(b + "mlp.grn.weight", {4 * c}, unit);
        add(b + "mlp.grn.bias", {4 * c}, unit);
      }
      add(b + "mlp.fc2.weight", {c, 4 * c}, unit);
      add(b + "mlp.fc2.bias", {c}, unit);
    }
  }
  const int64_t last = cfg.dims.back();
  add("head.norm.weight", {last}, "head");
  add("head.norm.bias", {last}, "head");
  add("head.fc.weight", {cfg.num_classes, last}, "head");
  add("head.fc.bias", {cfg.num_classes}, "head");
  return p;
}

std::vector<std::string> convnext_units(const ConvNeXtConfig& cfg) {
  return convnext_spec(cfg)->units();
}

void check_layer_decay_numbering(const ConvNeXtConfig& cfg) {
  CZ_CHECK(
      cfg.depths.size() == 4,
      "--layer-decay numbers ConvNeXt's four stages (Note [Layer-wise lr decay numbering]), but the model "
      "has {} (--depths {})",
      cfg.depths.size(), fmt::join(cfg.depths, ","));
  constexpr int64_t kMaxStage2 = 3 * (kConvNeXtDecayLayers - 3);
  CZ_CHECK(
      cfg.depths[2] <= kMaxStage2,
      "--layer-decay groups stage 2's blocks by three into layers 3-11, at most {} blocks, but the model "
      "has {} (--depths {})",
      kMaxStage2, cfg.depths[2], fmt::join(cfg.depths, ","));
}

int64_t convnext_layer_id(const std::string& name) {
  const auto field = [&](size_t k) {  // the k-th dot-separated field of the name, as a number
    size_t b = 0;
    for (size_t i = 0; i < k; ++i) b = name.find('.', b) + 1;
    return std::stoll(name.substr(b, name.find('.', b) - b));
  };
  if (name.rfind("stem.", 0) == 0) return 0;
  if (name.rfind("head.", 0) == 0) return kConvNeXtDecayLayers + 1;
  CZ_ASSERT(name.rfind("stages.", 0) == 0, "convnext_layer_id: '{}' is not a ConvNeXt parameter", name);
  const int64_t stage = field(1);
  const bool downsample = name.find(".downsample.") != std::string::npos;
  if (stage == 3) return kConvNeXtDecayLayers;
  if (downsample || stage < 2)
    return stage + 1;       // stage 0 has no downsample; stage 1's shares its blocks' id
  return 3 + field(3) / 3;  // stages.2.blocks.j
}

ConvNeXtConfig convnext_variant(const std::string& name) {
  const std::string key = name.rfind("convnext_", 0) == 0 ? name.substr(9) : name;
  for (const Variant& v : variants()) {
    if (key != v.name) continue;
    ConvNeXtConfig cfg;
    cfg.name = v.grn ? std::string(v.name) : std::string("convnext_") + v.name;
    cfg.depths = v.depths;
    cfg.dims = v.dims;
    cfg.conv_mlp = v.conv_mlp;
    cfg.grn = v.grn;
    if (v.grn) cfg.layer_scale_init = 0;
    return cfg;
  }
  throw ValueError(fmt::format("unknown model '{}' (expected one of: {})", name,
                               fmt::join(convnext_variant_names(), ", ")));
}

void ConvNeXtConfig::validate() const {
  CZ_CHECK(!depths.empty() && depths.size() == dims.size(),
           "model: --depths has {} stages but --dims has {}; they must match", depths.size(), dims.size());
  for (int64_t d : depths)
    CZ_CHECK(d > 0, "model: every depth must be positive (--depths {})", fmt::join(depths, ","));
  for (int64_t d : dims)
    CZ_CHECK(d > 0, "model: every dim must be positive (--dims {})", fmt::join(dims, ","));
  CZ_CHECK(in_chans > 0, "model: in_chans must be positive, got {}", in_chans);
  CZ_CHECK(num_classes > 0, "model: --num-classes must be positive, got {}", num_classes);
  CZ_CHECK(drop_path_rate >= 0 && drop_path_rate < 1, "model: --drop-path must be in [0, 1), got {}",
           drop_path_rate);
  CZ_CHECK(ln_eps > 0, "model: LayerNorm eps must be positive, got {}", ln_eps);
  CZ_CHECK(!grn || layer_scale_init <= 0,
           "model: ConvNeXt V2 blocks (GRN) have no layer scale, but layer_scale_init is {}",
           layer_scale_init);
}

ConvNeXtBlock::ConvNeXtBlock(int64_t dim, const ConvNeXtConfig& cfg, double drop_path, int64_t index,
                             std::shared_ptr<const DropPathContext> ctx, ParamOptions opt)
    : Module("ConvNeXtBlock"), drop_path_(drop_path), index_(index), ctx_(std::move(ctx)) {
  conv_dw_ = register_module("conv_dw", std::make_shared<DepthwiseConv2d>(dim, cfg.kernel, true, opt));
  norm_ = register_module("norm", std::make_shared<LayerNorm>(dim, cfg.ln_eps, opt));
  auto mlp = std::make_shared<NamedSequential>();
  fc1_ = std::make_shared<Linear>(dim, 4 * dim, true, opt);
  fc2_ = std::make_shared<Linear>(4 * dim, dim, true, opt);
  mlp->add("fc1", fc1_);
  mlp->add("act", std::make_shared<GELU>());
  if (cfg.grn) {
    grn_ = std::make_shared<GlobalResponseNorm>(4 * dim, opt);
    mlp->add("grn", grn_);
  }
  mlp->add("fc2", fc2_);
  mlp_ = register_module("mlp", std::static_pointer_cast<Sequential>(mlp));
  if (cfg.layer_scale_init > 0)
    gamma_ = register_parameter("gamma", full({dim}, cfg.layer_scale_init, opt.dtype, opt.device));
}

// Note [Fused epilogues on the CPU] (src/tensor/cpu/linear_fused.cpp): fc1 runs as linear_gelu, and fc2 with
// layer scale and residual as linear_scale_residual, instead of the mlp module's fc1 -> act -> fc2 and a
// separate residual_scale_add. The modules stay for their parameters (timm's names, mlp.fc1.weight ...), but
// their own forwards and hooks are not called: ZeRO's gathers, the tracer and the planner hook the block (its
// unit), which runs as before. With drop path the branch is scaled and dropped before the residual is added,
// so fc2 runs unfused there. On the CPU, where the MLP's weights are small (mlp_as_one_op: the first stages,
// where the activations are largest), the whole branch runs as one op, mlp_scale_residual (Note [The MLP on
// one tile]), and the GELU output never reaches memory. A V2 block (no gamma) runs linear_gelu, grn, then
// fc2 unfused and the residual added.
Tensor ConvNeXtBlock::forward(const Tensor& x) {
  const bool drop = is_training() && drop_path_ > 0;
  const Tensor& w1 = fc1_->weight();
  if (!drop && gamma_.defined() && mlp_as_one_op(x.is_cuda(), w1.size(1), w1.size(0)))
    return mlp_scale_residual(x, (*norm_)((*conv_dw_)(x)), w1, fc1_->bias(), fc2_->weight(), fc2_->bias(),
                              gamma_);
  Tensor a = linear_gelu((*norm_)((*conv_dw_)(x)), w1, fc1_->bias());
  if (grn_) a = grn(a, grn_->weight(), grn_->bias(), GlobalResponseNorm::kEps);
  if (!drop && gamma_.defined()) return linear_scale_residual(x, a, fc2_->weight(), fc2_->bias(), gamma_);
  Tensor h = linear(a, fc2_->weight(), fc2_->bias());
  a = Tensor();
  if (drop) {
    if (gamma_.defined()) h = channel_scale(h, gamma_);
    // Note [Drop-path masks]: a generator keyed by (seed, step, block), positioned at this rank's first
    // sample.
    const auto key = philox4x32(ctx_->seed, (ctx_->step << 16) ^ uint64_t(index_));
    Generator gen((uint64_t(key[0]) << 32) | key[1]);
    gen.set_state(gen.seed(), uint64_t(ctx_->sample_offset));
    return add(x, drop_path(h, drop_path_, gen));
  }
  return add(x, h);
}

ConvNeXtStage::ConvNeXtStage(int64_t in_dim, int64_t out_dim, int64_t depth, bool downsample,
                             const ConvNeXtConfig& cfg, const std::vector<double>& drop_paths,
                             int64_t first_block, std::shared_ptr<const DropPathContext> ctx,
                             ParamOptions opt)
    : Module("ConvNeXtStage") {
  if (downsample) {
    downsample_ = register_module("downsample", std::make_shared<Sequential>());
    downsample_->append(std::make_shared<LayerNorm>(in_dim, cfg.ln_eps, opt));
    downsample_->append(std::make_shared<PatchifyConv2d>(in_dim, out_dim, 2, true, opt));
  }
  blocks_ = register_module("blocks", std::make_shared<Sequential>());
  for (int64_t j = 0; j < depth; ++j)
    blocks_->append(std::make_shared<ConvNeXtBlock>(out_dim, cfg, drop_paths[size_t(first_block + j)],
                                                    first_block + j, ctx, opt));
}

Tensor ConvNeXtStage::forward(const Tensor& x) {
  Tensor h = downsample_ ? (*downsample_)(x) : x;
  for (const auto& [name, block] : blocks_->children()) {
    if (checkpointing_ && GradMode::enabled()) {
      Module* b = block.get();
      h = checkpoint([b](const std::vector<Tensor>& in) { return std::vector<Tensor>{(*b)(in[0])}; }, {h},
                     b->parameters())[0];
    } else {
      h = (*block)(h);
    }
  }
  return h;
}

ConvNeXt::ConvNeXt(const ConvNeXtConfig& cfg, ParamOptions opt)
    : Model("ConvNeXt"),
      cfg_(cfg),
      spec_(convnext_spec(cfg)),
      drop_ctx_(std::make_shared<DropPathContext>()) {
  stem_ = register_module("stem", std::make_shared<Sequential>());
  stem_->append(std::make_shared<PatchifyConv2d>(cfg.in_chans, cfg.dims[0], 4, true, opt));
  stem_->append(std::make_shared<LayerNorm>(cfg.dims[0], cfg.ln_eps, opt));

  // timm: rates rise linearly from 0 to drop_path_rate over all blocks.
  int64_t total = 0;
  for (int64_t d : cfg.depths) total += d;
  std::vector<double> rates(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i)
    rates[size_t(i)] = total > 1 ? cfg.drop_path_rate * double(i) / double(total - 1) : 0.0;

  stages_seq_ = register_module("stages", std::make_shared<Sequential>());
  int64_t first = 0;
  for (size_t i = 0; i < cfg.depths.size(); ++i) {
    auto stage = std::make_shared<ConvNeXtStage>(i == 0 ? cfg.dims[0] : cfg.dims[i - 1], cfg.dims[i],
                                                 cfg.depths[i], i > 0, cfg, rates, first, drop_ctx_, opt);
    stages_.push_back(stage);
    stages_seq_->append(stage);
    first += cfg.depths[i];
  }
  auto head = std::make_shared<NamedSequential>();
  head->add("global_pool", std::make_shared<GlobalAvgPool>());
  head->add("norm", std::make_shared<LayerNorm>(cfg.dims.back(), cfg.ln_eps, opt));
  head->add("fc", std::make_shared<Linear>(cfg.dims.back(), cfg.num_classes, true, opt));
  head_ = register_module("head", std::static_pointer_cast<Sequential>(head));

  // Note [ConvNeXt structure]: what was built is what the planner and the ZeRO engine are told.
  const NamedParameters built = named_parameters();
  const std::vector<ParamInfo> described = convnext_parameters(cfg_);
  CZ_ASSERT(built.size() == described.size(), "ConvNeXt built {} parameters, convnext_parameters lists {}",
            built.size(), described.size());
  for (size_t i = 0; i < built.size(); ++i) {
    const ParamInfo& d = described[i];
    CZ_ASSERT(built[i].first == d.name && built[i].second.sizes() == d.shape &&
                  built[i].first.rfind(d.unit + ".", 0) == 0,
              "ConvNeXt parameter {} is {} {}, convnext_parameters lists {} {} in unit {}", i, built[i].first,
              shape_str(built[i].second.sizes()), d.name, shape_str(d.shape), d.unit);
  }
}

Tensor ConvNeXt::forward(const Tensor& x) {
  CZ_CHECK_SHAPE(x.dim() == 4 && x.size(3) == cfg_.in_chans,
                 "ConvNeXt: input must be (N, H, W, {}) NHWC, got {}", cfg_.in_chans, shape_str(x.sizes()));
  const int64_t reduction = spec_->stride();
  CZ_CHECK_SHAPE(x.size(1) >= reduction && x.size(2) >= reduction,
                 "ConvNeXt: images of {}x{} are smaller than the network's total stride {}", x.size(1),
                 x.size(2), reduction);
  return (*head_)((*stages_seq_)((*stem_)(x)));
}

void ConvNeXt::init_weights(uint64_t seed) {
  Generator gen(seed);
  init_weights_timm(*this, gen);
  NoGradGuard no_grad;
  for (auto& [name, p] : named_parameters()) {
    Tensor t = p;
    if (name.size() >= 6 && name.compare(name.size() - 6, 6, ".gamma") == 0) t.fill_(cfg_.layer_scale_init);
    if (name.rfind("head.fc.", 0) == 0) t.mul_(cfg_.head_init_scale);
  }
}

void ConvNeXt::reset_head(uint64_t seed) {
  Generator gen(seed);
  Module* fc = find_module("head.fc");
  CZ_ASSERT(fc != nullptr);
  init_weights_timm(*fc, gen);
  NoGradGuard no_grad;
  for (auto& [name, p] : fc->local_parameters()) Tensor(p).mul_(cfg_.head_init_scale);
}

void ConvNeXt::set_activation_checkpointing(bool on) {
  for (auto& s : stages_) s->set_activation_checkpointing(on);
}

void ConvNeXt::set_drop_path_context(uint64_t seed, uint64_t step, int64_t sample_offset) {
  *drop_ctx_ = DropPathContext{seed, step, sample_offset};
}

}  // namespace cz::nn
