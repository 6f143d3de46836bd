// cz_weights: reads a weight file the way training does (--init-weights: timm or facebookresearch keys,
// PyTorch shapes, f16/f32/f64) into a ConvNeXt and writes it in the canonical form (timm keys, f32, PyTorch
// shapes). Checks a converted checkpoint before a long run; tools/check_weights_roundtrip.py drives it.
// Given a training checkpoint folder instead of a file, it exports the checkpoint's master (or --group ema)
// weights as a weight file, one tensor at a time (docs/checkpoints.md).
#include <sys/stat.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "io/checkpoint/checkpoint.h"
#include "io/checkpoint/weights.h"
#include "nn/convnext.h"

namespace {

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Note [One MLP layout for both exports]: timm builds atto..nano with conv_mlp=True, so their state dicts
// hold mlp.fc1/fc2 weights as (out, in, 1, 1), and the larger variants and custom ConvNeXts as Linear
// (out, in). `convnext_zero --export-weights` writes the model's layout as timm defines it
// (ConvNeXtConfig::conv_mlp); a checkpoint's export must write the same file (issue 30: it wrote atto's fc1
// as (160, 40) unless --conv-mlp). The model: a custom one when the run configuration the checkpoint records
// has --depths/--dims (the trainer names it "custom" whatever its sizes, and writes Linear weights); else the
// named variant whose depths and dims the checkpoint's tensors have (the tensors cannot disagree with
// themselves, where a configuration copied from elsewhere could). --conv-mlp still forces the 1x1 form.
struct MlpLayout {
  bool conv = false;
  std::string why;
};

MlpLayout checkpoint_mlp_layout(const cz::ckpt::Checkpoint& ckpt, const std::string& group) {
  const auto& strings = ckpt.scalars().strings;
  if (const auto it = strings.find("config"); it != strings.end()) {
    const nlohmann::json config = nlohmann::json::parse(it->second, nullptr, false);
    if (config.is_object() && config.contains("depths") && config["depths"].is_array() &&
        !config["depths"].empty())
      return {false, "a custom ConvNeXt: --depths/--dims in the checkpoint's configuration"};
  }
  std::vector<std::pair<std::string, cz::Shape>> shapes;
  for (const cz::ckpt::TensorInfo& t : ckpt.tensors(group)) shapes.emplace_back(t.name, t.shape);
  if (const std::optional<cz::WeightArchitecture> a = cz::infer_architecture(shapes)) {
    for (const std::string& name : cz::nn::convnext_variant_names()) {
      const cz::nn::ConvNeXtConfig v = cz::nn::convnext_variant(name);
      if (v.depths == a->depths && v.dims == a->dims && v.grn == a->grn)
        return {v.conv_mlp, fmt::format("{}, by the checkpoint's depths and dims", v.name)};
    }
  }
  return {false, "not one of timm's named variants"};
}

int export_checkpoint(const std::string& input, const std::string& output, const std::string& group,
                      bool conv_mlp) {
  if (output.empty()) {
    std::fprintf(stderr, "cz_weights: %s is a checkpoint folder: give the weight file to write\n",
                 input.c_str());
    return 1;
  }
  const cz::ckpt::Checkpoint ckpt = cz::ckpt::Checkpoint::open(input);
  MlpLayout layout = checkpoint_mlp_layout(ckpt, group);
  if (conv_mlp && !layout.conv) layout = {true, "--conv-mlp"};
  cz::ckpt::export_weights(ckpt, group, output, {.conv_mlp = layout.conv});
  std::printf(
      "%s (step %lld, saved at %d ranks): %zu tensors of '%s' written to %s, MLP weights as %s (%s)\n",
      ckpt.path().c_str(), static_cast<long long>(ckpt.step()), ckpt.world_size(), ckpt.tensors(group).size(),
      group.c_str(), output.c_str(),
      layout.conv ? "timm's 1x1 convolutions (out, in, 1, 1)" : "Linear (out, in)", layout.why.c_str());
  return 0;
}

// The model the weights are checked against: the file's own architecture (its attributes, or its datasets'
// names and shapes), with whatever --model/--depths/--dims/--num-classes say instead.
cz::nn::ConvNeXtConfig model_config(const std::string& input, const cz::WeightImportOptions& options,
                                    const std::string& model, const std::vector<int64_t>& depths,
                                    const std::vector<int64_t>& dims, std::optional<int64_t> num_classes) {
  const bool explicit_model = !model.empty() || !depths.empty();
  std::optional<cz::WeightArchitecture> arch;
  if (!explicit_model) {
    arch = cz::read_weight_architecture(input, options);
  } else if (!num_classes) {
    try {
      arch = cz::read_weight_architecture(input, options);  // for its classes only
    } catch (const cz::IoError&) {
    }
  }
  cz::nn::ConvNeXtConfig cfg;
  if (!depths.empty()) {
    cfg.depths = depths;
    cfg.dims = dims;
  } else if (!model.empty()) {
    cfg = cz::nn::convnext_variant(model);
  } else {
    cfg.depths = arch->depths;
    cfg.dims = arch->dims;
    cfg.in_chans = arch->in_chans;
    cfg.kernel = arch->kernel;
    cfg.conv_mlp = arch->conv_mlp;
    if (!arch->layer_scale) cfg.layer_scale_init = 0;
    cfg.grn = arch->grn;
  }
  cfg.num_classes = num_classes ? *num_classes : arch && arch->num_classes > 0 ? arch->num_classes : 1000;
  if (!explicit_model)
    std::printf("%s: depths (%s) dims (%s), %lld classes (from the file's %s)\n", input.c_str(),
                fmt::format("{}", fmt::join(cfg.depths, ", ")).c_str(),
                fmt::format("{}", fmt::join(cfg.dims, ", ")).c_str(), static_cast<long long>(cfg.num_classes),
                arch->source.c_str());
  return cfg;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Import a ConvNeXt weight file (HDF5) as training would and export it with timm keys"};
  std::string input, output, model;
  std::vector<int64_t> depths, dims;
  int64_t num_classes = 0;
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
               "checkpoint export: MLP weights as timm's 1x1 convolutions (out, in, 1, 1) whatever the model "
               "(default: the layout timm gives the checkpoint's model, as --export-weights writes it: 1x1 "
               "convolutions for atto..nano, Linear otherwise)");
  app.add_option("--model", model,
                 "ConvNeXt variant (default: the file's own, from its attributes or shapes)");
  app.add_option("--depths", depths, "custom blocks per stage (with --dims)")->delimiter(',');
  app.add_option("--dims", dims, "custom channels per stage (with --depths)")->delimiter(',');
  CLI::Option* classes =
      app.add_option("--num-classes", num_classes, "classifier outputs (default: the file's, else 1000)")
          ->check(CLI::PositiveNumber);
  app.add_option("--group", options.group, "read the datasets under this group only");
  app.add_flag("--reset-head", reset_head, "leave the file's classifier out; a new one is initialised");
  CLI11_PARSE(app, argc, argv);
  try {
    if (is_dir(input)) return export_checkpoint(input, output, group, conv_mlp);
    const cz::nn::ConvNeXtConfig cfg =
        model_config(input, options, model, depths, dims,
                     classes->count() ? std::optional<int64_t>(num_classes) : std::nullopt);
    cz::nn::ConvNeXt net(cfg);
    net.init_weights(0);
    if (reset_head) options.skip_prefixes = {"head.fc."};
    const cz::WeightImportReport r = cz::import_weights(input, net.named_parameters(), options);
    std::printf("%s: %lld tensors, %lld values (%s keys)\n", input.c_str(), static_cast<long long>(r.tensors),
                static_cast<long long>(r.elements), r.key_style.c_str());
    if (!output.empty()) {
      // The file's class names stay with its classifier (a new head has none).
      cz::export_weights(
          output, net.named_parameters(),
          {.conv_mlp = cfg.conv_mlp, .class_names = reset_head ? std::vector<std::string>{} : r.class_names});
      std::printf("wrote %s\n", output.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cz_weights: %s\n", e.what());
    return 1;
  }
  return 0;
}
