// ConvNeXt (Liu et al. 2022) and ConvNeXt V2 (Woo et al. 2023) with timm's module structure and state-dict
// names: stem.{0,1}, stages.i.downsample.{0,1} (i > 0), stages.i.blocks.j.{gamma,conv_dw,norm,mlp.fc1,
// mlp.grn,mlp.fc2} (gamma in V1 blocks, mlp.grn in V2 blocks), head.norm, head.fc.
// Activations are NHWC throughout: input (N, H, W, in_chans) -> logits (N, num_classes).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/model.h"

namespace cz::nn {

struct ConvNeXtConfig {
  std::string name = "custom";
  std::vector<int64_t> depths{3, 3, 9, 3};
  std::vector<int64_t> dims{96, 192, 384, 768};
  int64_t in_chans = 3;
  int64_t num_classes = 1000;
  int64_t kernel = 7;
  double drop_path_rate = 0.0;     // stochastic depth, rising linearly over blocks from 0 to this (timm)
  double layer_scale_init = 1e-6;  // <= 0: no layer scale
  double head_init_scale = 1.0;
  double ln_eps = 1e-6;
  // timm builds atto..nano with 1x1 convolutions for the MLP (conv_mlp): the same arithmetic, but fc1/fc2
  // weights of shape (out, in, 1, 1) in its state dict. Only exported weight files follow this.
  bool conv_mlp = false;
  // ConvNeXt V2 blocks: GlobalResponseNorm between the MLP's GELU and fc2 (mlp.grn.weight, mlp.grn.bias) and
  // no layer scale, so layer_scale_init must be <= 0 (timm's use_grn=True, ls_init_value=None).
  bool grn = false;

  void validate() const;  // throws ValueError naming the bad field
};

// timm's variants: atto, femto, pico, nano, tiny, small, base, large, xlarge (with or without "convnext_"),
// and V2's convnextv2_atto, _femto, _pico, _nano, _tiny, _small, _base, _large, _huge (grn, no layer scale).
ConvNeXtConfig convnext_variant(const std::string& name);
std::vector<std::string> convnext_variant_names();

// Multiply-accumulates of one forward pass over one `image` x `image` picture: the convolutions and linear
// layers, which is what PyTorch's FlopCounterMode and timm's model tables count (norms, activations, pooling
// and the loss are left out). A training step costs about 3x that per image (forward, input gradients, weight
// gradients), so its FLOPs are 6x the MACs: the figure MFU is computed from.
int64_t convnext_forward_macs(const ConvNeXtConfig& cfg, int64_t image);

// Note [ConvNeXt structure]: the model's parameters and its ZeRO-3 units, from a config alone. The planner
// asks this without building the model (xlarge would allocate and initialise 350M parameters), the ZeRO
// engine gets its units from ConvNeXt::units(), and ConvNeXt's constructor checks the module tree it built
// against this list (names, shapes, order), so the description and the modules cannot drift apart.
// In registration order (the order of the flat buffer): stem, then each stage's downsample and blocks (a
// block registers gamma before its children; a V2 block's MLP registers fc1, grn, fc2), then head.norm and
// head.fc.
std::vector<ParamInfo> convnext_parameters(const ConvNeXtConfig& cfg);
// The units in that order: the modules ZeRO stage 3 gathers and releases whole ("stem",
// "stages.i.downsample" for i > 0, "stages.i.blocks.j", "head"); every parameter lies in exactly one.
std::vector<std::string> convnext_units(const ConvNeXtConfig& cfg);
// The model as the planner and the what-if walk it (model.h), from its config alone.
std::shared_ptr<const ModelSpec> convnext_spec(const ConvNeXtConfig& cfg);

// Note [Layer-wise lr decay numbering]: fine-tuning scales each parameter's lr by D^(num_layers + 1 - id),
// with the layer ids of the official ConvNeXt code (facebookresearch/ConvNeXt, optim_factory.py,
// get_num_layer_for_convnext), which cuts [3, 3, 27, 3] into 12 layers: the stem is 0, stage 0's blocks 1,
// stage 1's downsample and blocks 2, stage 2's downsample 3 and its blocks j at 3 + j / 3 (groups of three),
// stage 3's downsample and blocks 12, and the head (norm and fc) 13. The numbering is fixed, not derived
// from the depths: with fewer than 27 blocks in stage 2 (tiny's 9, atto's 6) ids 6-11 stay empty, exactly as
// the official function numbers them, so stage 3 is one decay below the head and several above stage 2.
// num_layers is 12 for every model; stage 2 may hold at most 27 blocks (ids up to 11), and there must be
// four stages. A block's parameters share its id, V2's mlp.grn.weight and .bias included: the official
// function reads only the stage and block fields of a name.
inline constexpr int64_t kConvNeXtDecayLayers = 12;
// Throws ValueError naming --layer-decay unless `cfg` has four stages and at most 27 blocks in stage 2.
void check_layer_decay_numbering(const ConvNeXtConfig& cfg);
// The layer id (0 .. kConvNeXtDecayLayers + 1) of a parameter named as convnext_parameters names it.
int64_t convnext_layer_id(const std::string& param_name);

// Note [Drop-path masks]: a block's mask for a sample depends only on (seed, step, block index, the sample's
// index in the global batch). So a W-rank run (each rank holding a slice of the global batch) drops exactly
// the samples a single-process run drops, and a checkpointed block's recompute reproduces its mask.
struct DropPathContext {
  uint64_t seed = 0;
  uint64_t step = 0;
  int64_t sample_offset = 0;  // global index of this rank's first sample in the batch
};

class ConvNeXtBlock : public Module {
 public:
  ConvNeXtBlock(int64_t dim, const ConvNeXtConfig& cfg, double drop_path, int64_t index,
                std::shared_ptr<const DropPathContext> ctx, ParamOptions opt);
  Tensor forward(const Tensor& x) override;
  double drop_path_rate() const { return drop_path_; }

 private:
  std::shared_ptr<DepthwiseConv2d> conv_dw_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Sequential> mlp_;  // fc1, act, (grn,) fc2: the parameters' names; forward calls their ops
  std::shared_ptr<Linear> fc1_, fc2_;
  std::shared_ptr<GlobalResponseNorm> grn_;  // V2 blocks only
  Tensor gamma_;
  double drop_path_;
  int64_t index_;
  std::shared_ptr<const DropPathContext> ctx_;
};

class ConvNeXtStage : public Module {
 public:
  ConvNeXtStage(int64_t in_dim, int64_t out_dim, int64_t depth, bool downsample, const ConvNeXtConfig& cfg,
                const std::vector<double>& drop_paths, int64_t first_block,
                std::shared_ptr<const DropPathContext> ctx, ParamOptions opt);
  Tensor forward(const Tensor& x) override;
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }

 private:
  std::shared_ptr<Sequential> downsample_;
  std::shared_ptr<Sequential> blocks_;
  bool checkpointing_ = false;
};

class ConvNeXt : public Model {
 public:
  explicit ConvNeXt(const ConvNeXtConfig& cfg, ParamOptions opt = {});
  Tensor forward(const Tensor& x) override;

  const ConvNeXtConfig& config() const { return cfg_; }
  const ModelSpec& spec() const override { return *spec_; }
  // timm initialisation from `seed` (see init_weights_timm), then layer scale and head scaling.
  void init_weights(uint64_t seed) override;
  // Re-initialises head.fc (for fine-tuning on another number of classes: build the model with the new
  // num_classes, import everything but the head, then call this).
  void reset_head(uint64_t seed) override;
  // Recompute each block's activations in backward instead of keeping them.
  void set_activation_checkpointing(bool on) override;
  // Drop-path randomness for the next forward (Note [Drop-path masks]).
  void set_drop_path_context(uint64_t seed, uint64_t step, int64_t sample_offset) override;

 private:
  ConvNeXtConfig cfg_;
  std::shared_ptr<const ModelSpec> spec_;
  std::shared_ptr<DropPathContext> drop_ctx_;
  std::shared_ptr<Sequential> stem_;
  std::vector<std::shared_ptr<ConvNeXtStage>> stages_;
  std::shared_ptr<Sequential> stages_seq_;
  std::shared_ptr<Sequential> head_;
};

}  // namespace cz::nn
