// Weight files: HDF5 with one dataset per parameter, named by timm's state-dict keys, in PyTorch's shapes
// (docs/weights.md). Import also understands the original facebookresearch/ConvNeXt keys and timm's 1x1-conv
// MLP form (atto..nano), and reports every missing, unexpected or misshapen key in one error.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "io/h5/h5_file.h"
#include "tensor/tensor.h"

namespace cz {

using NamedTensorList = std::vector<std::pair<std::string, Tensor>>;

struct WeightImportOptions {
  // Read the datasets under this group only ("weights" for the parity fixtures); empty: the whole file.
  std::string group;
  // Parameters (and file keys) under these prefixes are left alone: "head.fc." for --reset-head, where the
  // file may have been trained for another number of classes.
  std::vector<std::string> skip_prefixes;
};

struct WeightImportReport {
  std::string key_style;  // "timm" or "facebook"
  int64_t tensors = 0;    // parameters loaded
  int64_t elements = 0;
  // The file's `class_names` attribute (what each classifier output stands for); empty when it has none.
  std::vector<std::string> class_names;
};

// Copies the file's weights into `params` (values converted to each parameter's dtype and device). Parameter
// shapes are PyTorch's (conv OIHW, linear (out, in)), so no layout changes are needed; a linear weight may
// also be stored as a 1x1 convolution (out, in, 1, 1). Datasets may be f16, f32 or f64. IoError naming the
// file and listing every offender (missing, unexpected, duplicated, wrong shape or type; each with the shapes
// involved) when the file does not fit; nothing is modified then, nor when reading fails part-way.
WeightImportReport import_weights(const std::string& path, const NamedTensorList& params,
                                  const WeightImportOptions& options = {});

// The ConvNeXt a weight file holds, as far as its parameters determine it (the fields a model must match to
// load the file; drop-path rate and initialisation scales leave no trace in the weights).
struct WeightArchitecture {
  std::vector<int64_t> depths;  // blocks per stage
  std::vector<int64_t> dims;    // channels per stage
  int64_t num_classes = 0;      // 0: the file has no classifier (head.fc.*)
  int64_t in_chans = 3;
  int64_t kernel = 7;       // the depthwise convolution's
  bool conv_mlp = false;    // fc1/fc2 weights stored as (out, in, 1, 1) (timm's atto..nano)
  bool layer_scale = true;  // the blocks have `gamma`
  bool grn = false;         // ConvNeXt V2 blocks: `mlp.grn.weight` and `.bias`
  std::string source;       // "attributes" (written by export) or "shapes" (inferred from the datasets)
};

// The architecture of the ConvNeXt whose parameters are named (timm or facebookresearch keys, a leading
// `module.` dropped) and shaped as given; nullopt when they are not a ConvNeXt's (no stem, no stages, gaps in
// the block indices, inconsistent channels). Depths follow from which stages.i.blocks.j exist, channels and
// classes from the shapes.
std::optional<WeightArchitecture> infer_architecture(
    const std::vector<std::pair<std::string, Shape>>& shapes);

// The architecture of the weights in `path` (under `options.group`): from the root attributes export writes
// when they are there, else inferred from the datasets (files from timm or other tools). IoError naming the
// file when neither says what model it holds.
WeightArchitecture read_weight_architecture(const std::string& path, const WeightImportOptions& options = {});

// Writes `params` (any float dtype, any device) as f32 datasets under their names, in their (PyTorch) shapes,
// plus root attributes `format` ("convnext_zero.weights") and `version`, `class_names` when given, and, when
// the parameters are a ConvNeXt's, its architecture: `depths`, `dims` (i64 arrays), `num_classes`,
// `in_chans`, `kernel`, `conv_mlp`, `layer_scale` and `grn` (i64; the last three 0 or 1; a file without
// `grn` has no GRN). Crash-safe: the data goes to
// a temporary file beside `path`, which is synced and renamed over it only when complete; an existing file
// stays intact if anything fails (bad parameter, unwritable directory, full disk).
struct WeightExportOptions {
  // Write `*.mlp.fc1.weight` / `*.mlp.fc2.weight` as (out, in, 1, 1), the shape timm's conv-MLP models
  // (atto..nano, ConvNeXtConfig::conv_mlp) have in their state dicts, so the file loads into them strictly.
  bool conv_mlp = false;
  // The training set's class names (Note [Class names] in dataset_views.cpp), written as the root attribute
  // `class_names`, a JSON array of strings (`json.loads(f.attrs["class_names"])`); none when empty.
  std::vector<std::string> class_names = {};
};
void export_weights(const std::string& path, const NamedTensorList& params,
                    const WeightExportOptions& options = {});

// The writer behind export_weights, for callers that produce the tensors one at a time (checkpoint export):
// the same format, and the same crash safety (nothing appears under `path` before commit()).
class WeightFileWriter {
 public:
  explicit WeightFileWriter(const std::string& path, const WeightExportOptions& options = {});
  // t: any float dtype and device; written as f32 in its shape. CZ_CHECK on an empty or repeated name.
  void add(const std::string& name, const Tensor& t);
  void commit();

 private:
  h5::File file_;
  WeightExportOptions options_;
  std::set<std::string> names_;
  std::vector<std::pair<std::string, Shape>>
      shapes_;  // as written: the architecture attributes come from them
};

// Class names as the JSON array a weight file's attribute and a checkpoint's scalar hold them, and back
// (IoError naming `where` when the text is not an array of strings).
std::string class_names_to_json(const std::vector<std::string>& names);
std::vector<std::string> class_names_from_json(const std::string& json, const std::string& where);

// The timm key for an original facebookresearch/ConvNeXt key ("downsample_layers.0.0.weight" ->
// "stem.0.weight", "stages.1.2.pwconv1.bias" -> "stages.1.blocks.2.mlp.fc1.bias", ConvNeXt V2's
// "stages.1.2.grn.gamma" / ".beta" -> "stages.1.blocks.2.mlp.grn.weight" / ".bias", "norm.weight" ->
// "head.norm.weight", "head.weight" -> "head.fc.weight"); nullopt when the key is not of that form.
std::optional<std::string> timm_key_from_facebook(const std::string& key);

}  // namespace cz
