// cz_weights: reads a weight file the way training does (--init-weights: timm or facebookresearch keys,
// PyTorch shapes, f16/f32/f64) into a ConvNeXt and writes it in the canonical form (timm keys, f32, PyTorch
// shapes). Checks a converted checkpoint before a long run; tools/check_weights_roundtrip.py drives it.
// Given a training checkpoint folder instead of a file, it exports the checkpoint's master (or --group ema)
// weights as a weight file, one tensor at a time (docs/checkpoints.md).
#include <sys/stat.h>
#include <CLI/CLI.hpp>

#include <cstdio>

#include "io/checkpoint.h"
#include "io/weights.h"
#include "nn/convnext.h"

namespace {

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int export_checkpoint(const std::string& input, const std::string& output, const std::string& group,
                      bool conv_mlp) {
  if (output.empty()) {
    std::fprintf(stderr, "cz_weights: %s is a checkpoint folder: give the weight file to write\n",
                 input.c_str());
    return 1;
  }
  const cz::ckpt::Checkpoint ckpt = cz::ckpt::Checkpoint::open(input);
  cz::ckpt::export_weights(ckpt, group, output, {.conv_mlp = conv_mlp});
  std::printf("%s (step %lld, saved at %d ranks): %zu tensors of '%s' written to %s\n", ckpt.path().c_str(),
              static_cast<long long>(ckpt.step()), ckpt.world_size(), ckpt.tensors(group).size(),
              group.c_str(), output.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Import a ConvNeXt weight file (HDF5) as training would and export it with timm keys"};
  std::string input, output, model = "convnext_tiny";
  std::vector<int64_t> depths, dims;
  int64_t num_classes = 1000;
  cz::WeightImportOptions options;
  bool reset_head = false;
  std::string group = "params";
  bool conv_mlp = false;
  app.add_option("input", input, "HDF5 weights to read, or a checkpoint folder (dir or dir/step_N) to export")
      ->required();
  app.add_option("output", output, "HDF5 file to write (timm keys); omit to only check the input");
  app.add_option("--checkpoint-group", group, "checkpoint export: which weights (params: fp32 master, ema)")
      ->capture_default_str();
  app.add_flag("--conv-mlp", conv_mlp,
               "checkpoint export: MLP weights as timm's 1x1 convolutions (atto..nano load them strictly)");
  app.add_option("--model", model, "ConvNeXt variant")->capture_default_str();
  app.add_option("--depths", depths, "custom blocks per stage (with --dims)")->delimiter(',');
  app.add_option("--dims", dims, "custom channels per stage (with --depths)")->delimiter(',');
  app.add_option("--num-classes", num_classes, "classifier outputs")->capture_default_str();
  app.add_option("--group", options.group, "read the datasets under this group only");
  app.add_flag("--reset-head", reset_head, "leave the file's classifier out; a new one is initialised");
  CLI11_PARSE(app, argc, argv);
  try {
    if (is_dir(input)) return export_checkpoint(input, output, group, conv_mlp);
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
