// cz_weights: reads a weight file the way training does (--init-weights: timm or facebookresearch keys,
// PyTorch shapes, f16/f32/f64) into a ConvNeXt and writes it in the canonical form (timm keys, f32, PyTorch
// shapes). Checks a converted checkpoint before a long run; tools/check_weights_roundtrip.py drives it.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "io/weights.h"
#include "nn/convnext.h"

int main(int argc, char** argv) {
  CLI::App app{"Import a ConvNeXt weight file (HDF5) as training would and export it with timm keys"};
  std::string input, output, model = "convnext_tiny";
  std::vector<int64_t> depths, dims;
  int64_t num_classes = 1000;
  cz::WeightImportOptions options;
  bool reset_head = false;
  app.add_option("input", input, "HDF5 weights to read")->required();
  app.add_option("output", output, "HDF5 file to write (timm keys); omit to only check the input");
  app.add_option("--model", model, "ConvNeXt variant")->capture_default_str();
  app.add_option("--depths", depths, "custom blocks per stage (with --dims)")->delimiter(',');
  app.add_option("--dims", dims, "custom channels per stage (with --depths)")->delimiter(',');
  app.add_option("--num-classes", num_classes, "classifier outputs")->capture_default_str();
  app.add_option("--group", options.group, "read the datasets under this group only");
  app.add_flag("--reset-head", reset_head, "leave the file's classifier out; a new one is initialised");
  CLI11_PARSE(app, argc, argv);
  try {
    cz::nn::ConvNeXtConfig cfg = depths.empty() ? cz::nn::convnext_variant(model) : cz::nn::ConvNeXtConfig{};
    if (!depths.empty()) {
      cfg.depths = depths;
      cfg.dims = dims;
    }
    cfg.num_classes = num_classes;
    cz::nn::ConvNeXt net(cfg);
    net.init_weights(0);
    if (reset_head) options.skip_prefixes = {"head.fc."};
    const cz::WeightImportReport r = cz::import_weights(input, net.named_parameters(), options);
    std::printf("%s: %lld tensors, %lld values (%s keys)\n", input.c_str(), static_cast<long long>(r.tensors),
                static_cast<long long>(r.elements), r.key_style.c_str());
    if (!output.empty()) {
      cz::export_weights(output, net.named_parameters(), {.conv_mlp = cfg.conv_mlp});
      std::printf("wrote %s\n", output.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cz_weights: %s\n", e.what());
    return 1;
  }
  return 0;
}
