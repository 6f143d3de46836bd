// The architecture the flags name, and the dtype flags. Validation comes from the flag table (flags.h).
#include "dist/train/config.h"

#include "tensor/check.h"

namespace cz::train {

nn::ConvNeXtConfig TrainConfig::model_config() const {
  nn::ConvNeXtConfig mc = depths.empty() ? nn::convnext_variant(model) : nn::ConvNeXtConfig{};
  if (!depths.empty()) {
    mc.name = "custom";
    mc.depths = depths;
    mc.dims = dims;
    mc.grn = grn;
  }
  mc.num_classes = num_classes;
  mc.drop_path_rate = drop_path;
  mc.layer_scale_init = mc.grn ? 0.0 : layer_scale_init;  // V2 blocks have no layer scale
  mc.head_init_scale = head_init_scale;
  return mc;
}

MixConfig TrainConfig::mix_config() const {
  MixConfig m;
  m.mixup_alpha = mixup;
  m.cutmix_alpha = cutmix;
  if (!cutmix_minmax.empty()) m.cutmix_minmax = parse_cutmix_minmax(cutmix_minmax, "--cutmix-minmax");
  m.prob = mixup_prob;
  m.switch_prob = mixup_switch_prob;
  m.mode = parse_mix_mode(mixup_mode);
  m.label_smoothing = label_smoothing;
  m.num_classes = num_classes;
  return m;
}

DType dtype_of_flag(const std::string& flag) {
  CZ_CHECK_DTYPE(flag == "fp32" || flag == "bf16" || flag == "fp16", "expected fp32, bf16 or fp16, got '{}'",
                 flag);
  return flag == "bf16" ? DType::bf16 : flag == "fp16" ? DType::f16 : DType::f32;
}

}  // namespace cz::train
