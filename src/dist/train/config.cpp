// The architecture the flags name, and the dtype flags. Validation comes from the flag table (flags.cpp).
#include "dist/train/config.h"

#include "tensor/check.h"

namespace cz::train {

nn::ConvNeXtConfig TrainConfig::model_config() const {
  nn::ConvNeXtConfig mc = depths.empty() ? nn::convnext_variant(model) : nn::ConvNeXtConfig{};
  if (!depths.empty()) {
    mc.name = "custom";
    mc.depths = depths;
    mc.dims = dims;
  }
  mc.num_classes = num_classes;
  mc.drop_path_rate = drop_path;
  mc.layer_scale_init = layer_scale_init;
  mc.head_init_scale = head_init_scale;
  return mc;
}

DType dtype_of_flag(const std::string& flag) {
  CZ_CHECK_DTYPE(flag == "fp32" || flag == "bf16" || flag == "fp16", "expected fp32, bf16 or fp16, got '{}'",
                 flag);
  return flag == "bf16" ? DType::bf16 : flag == "fp16" ? DType::f16 : DType::f32;
}

}  // namespace cz::train
