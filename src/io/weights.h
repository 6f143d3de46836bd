// Weight files: HDF5 with one dataset per parameter, named by timm's state-dict keys, in PyTorch's shapes
// (docs/weights.md). Import also understands the original facebookresearch/ConvNeXt keys and timm's 1x1-conv
// MLP form (atto..nano), and reports every missing, unexpected or misshapen key in one error.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "io/h5_file.h"
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
};

// Copies the file's weights into `params` (values converted to each parameter's dtype and device). Parameter
// shapes are PyTorch's (conv OIHW, linear (out, in)), so no layout changes are needed; a linear weight may
// also be stored as a 1x1 convolution (out, in, 1, 1). Datasets may be f16, f32 or f64. IoError naming the
// file and listing every offender (missing, unexpected, duplicated, wrong shape or type; each with the shapes
// involved) when the file does not fit; nothing is modified then, nor when reading fails part-way.
WeightImportReport import_weights(const std::string& path, const NamedTensorList& params,
                                  const WeightImportOptions& options = {});

// Writes `params` (any float dtype, any device) as f32 datasets under their names, in their (PyTorch) shapes,
// plus root attributes `format` ("convnext_zero.weights") and `version`. Crash-safe: the data goes to a
// temporary file beside `path`, which is synced and renamed over it only when complete; an existing file
// stays intact if anything fails (bad parameter, unwritable directory, full disk).
struct WeightExportOptions {
  // Write `*.mlp.fc1.weight` / `*.mlp.fc2.weight` as (out, in, 1, 1), the shape timm's conv-MLP models
  // (atto..nano, ConvNeXtConfig::conv_mlp) have in their state dicts, so the file loads into them strictly.
  bool conv_mlp = false;
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
};

// The timm key for an original facebookresearch/ConvNeXt key ("downsample_layers.0.0.weight" ->
// "stem.0.weight", "stages.1.2.pwconv1.bias" -> "stages.1.blocks.2.mlp.fc1.bias", "norm.weight" ->
// "head.norm.weight", "head.weight" -> "head.fc.weight"); nullopt when the key is not of that form.
std::optional<std::string> timm_key_from_facebook(const std::string& key);

}  // namespace cz
