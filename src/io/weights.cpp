// Weight import (timm or original ConvNeXt keys, PyTorch shapes) and export (timm keys).
#include "io/weights.h"

#include <algorithm>
#include <map>
#include <regex>

#include "io/h5.h"
#include "tensor/autograd/engine.h"

namespace cz {
namespace {

constexpr const char* kFormat = "convnext_zero.weights";
constexpr int64_t kVersion = 1;

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

bool skipped(const std::string& key, const WeightImportOptions& opt) {
  return std::any_of(opt.skip_prefixes.begin(), opt.skip_prefixes.end(),
                     [&](const std::string& p) { return starts_with(key, p); });
}

// Wrappers PyTorch checkpoints commonly add around a state dict: a "model"/"state_dict" group, DDP's "module.".
std::string strip_wrappers(std::string key) {
  for (const char* g : {"model/", "state_dict/", "model_ema/"})
    if (starts_with(key, g)) key = key.substr(std::string(g).size());
  if (starts_with(key, "module.")) key = key.substr(7);
  return key;
}

// The file shape is acceptable for a parameter of `expected` shape: equal, or a linear layer stored as the 1x1
// convolution (out, in, 1, 1) of timm's conv-MLP variants.
bool shape_fits(const Shape& file, const Shape& expected) {
  if (file == expected) return true;
  return expected.size() == 2 && file.size() == 4 && file[0] == expected[0] && file[1] == expected[1] &&
         file[2] == 1 && file[3] == 1;
}

std::string list_some(const std::vector<std::string>& items) {
  constexpr size_t kShown = 12;
  std::vector<std::string> shown(items.begin(), items.begin() + std::min(items.size(), kShown));
  std::string s = fmt::format("{}", fmt::join(shown, ", "));
  if (items.size() > kShown) s += fmt::format(", ... and {} more", items.size() - kShown);
  return s;
}

}  // namespace

std::optional<std::string> timm_key_from_facebook(const std::string& key) {
  static const std::regex stem(R"(^downsample_layers\.0\.([01])\.(.+)$)");
  static const std::regex down(R"(^downsample_layers\.([1-9][0-9]*)\.([01])\.(.+)$)");
  static const std::regex block(R"(^stages\.([0-9]+)\.([0-9]+)\.(dwconv|norm|pwconv1|pwconv2|gamma)(\.(.+))?$)");
  std::smatch m;
  if (std::regex_match(key, m, stem)) return fmt::format("stem.{}.{}", m[1].str(), m[2].str());
  if (std::regex_match(key, m, down))
    return fmt::format("stages.{}.downsample.{}.{}", m[1].str(), m[2].str(), m[3].str());
  if (std::regex_match(key, m, block)) {
    static const std::map<std::string, std::string> names = {
        {"dwconv", "conv_dw"}, {"norm", "norm"}, {"pwconv1", "mlp.fc1"}, {"pwconv2", "mlp.fc2"}, {"gamma", "gamma"}};
    std::string out = fmt::format("stages.{}.blocks.{}.{}", m[1].str(), m[2].str(), names.at(m[3].str()));
    if (m[5].matched) out += "." + m[5].str();
    else if (m[3].str() != "gamma") return std::nullopt;
    return out;
  }
  if (starts_with(key, "norm.")) return "head.norm." + key.substr(5);
  if (starts_with(key, "head.") && !starts_with(key, "head.fc.") && !starts_with(key, "head.norm."))
    return "head.fc." + key.substr(5);
  return std::nullopt;
}

WeightImportReport import_weights(const std::string& path, const NamedTensorList& params,
                                  const WeightImportOptions& options) {
  const h5::File file = h5::File::open(path);
  std::map<std::string, std::string> expected_keys;  // timm name -> file key
  WeightImportReport report;

  // Map every file key to a timm name; the style is whichever maps more keys onto our parameters.
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : params) by_name[name] = &t;
  std::vector<std::string> keys;
  const std::string group = options.group.empty() ? "" : options.group + "/";
  for (const std::string& k : file.datasets())
    if (starts_with(k, group)) keys.push_back(k);
  std::map<std::string, std::string> timm_map, fb_map;  // file key -> timm name
  int timm_hits = 0, fb_hits = 0;
  for (const std::string& k : keys) {
    const std::string bare = strip_wrappers(k.substr(group.size()));
    timm_map[k] = bare;
    timm_hits += by_name.count(bare) ? 1 : 0;
    if (auto t = timm_key_from_facebook(bare)) {
      fb_map[k] = *t;
      fb_hits += by_name.count(*t) ? 1 : 0;
    } else {
      fb_map[k] = bare;
    }
  }
  const bool facebook = fb_hits > timm_hits;
  const auto& key_map = facebook ? fb_map : timm_map;
  report.key_style = facebook ? "facebook" : "timm";

  std::map<std::string, std::string> file_key_of;  // timm name -> file key
  std::vector<std::string> unexpected, missing, misshapen, duplicated;
  for (const auto& [file_key, name] : key_map) {
    if (skipped(name, options)) continue;
    if (!by_name.count(name)) {
      unexpected.push_back(file_key);
      continue;
    }
    if (file_key_of.count(name)) {
      duplicated.push_back(fmt::format("{} (also {})", file_key, file_key_of[name]));
      continue;
    }
    file_key_of[name] = file_key;
  }
  for (const auto& [name, t] : params) {
    if (skipped(name, options)) continue;
    auto it = file_key_of.find(name);
    if (it == file_key_of.end()) {
      missing.push_back(name);
      continue;
    }
    const h5::DatasetInfo info = file.info(it->second);
    if (!shape_fits(info.shape, t.sizes()) || !is_floating(info.dtype))
      misshapen.push_back(fmt::format("{}: file has {} {}, expected {} {}", it->second, dtype_name(info.dtype),
                                      shape_str(info.shape), dtype_name(t.dtype()), shape_str(t.sizes())));
  }
  if (!unexpected.empty() || !missing.empty() || !misshapen.empty() || !duplicated.empty()) {
    std::string msg = fmt::format("{}: weights do not match the model ({} keys, read as {} names)", path,
                                  keys.size(), report.key_style);
    if (!missing.empty()) msg += fmt::format("\n  missing ({}): {}", missing.size(), list_some(missing));
    if (!unexpected.empty()) msg += fmt::format("\n  unexpected ({}): {}", unexpected.size(), list_some(unexpected));
    if (!misshapen.empty()) msg += fmt::format("\n  wrong shape ({}): {}", misshapen.size(), list_some(misshapen));
    if (!duplicated.empty()) msg += fmt::format("\n  duplicated ({}): {}", duplicated.size(), list_some(duplicated));
    throw IoError(msg);
  }

  // Read everything before writing anything, so a failing read leaves the model untouched.
  std::vector<std::pair<const Tensor*, Tensor>> values;
  for (const auto& [name, t] : params) {
    if (skipped(name, options)) continue;
    Tensor v = file.read(file_key_of.at(name));
    if (v.sizes() != t.sizes()) v = v.reshape(t.sizes());  // (out, in, 1, 1) -> (out, in)
    values.emplace_back(&t, std::move(v));
  }
  NoGradGuard no_grad;
  for (auto& [t, v] : values) {
    Tensor(*t).copy_(v);
    ++report.tensors;
    report.elements += v.numel();
  }
  return report;
}

void export_weights(const std::string& path, const NamedTensorList& params) {
  h5::File file = h5::File::create(path);
  file.set_string_attr("/", "format", kFormat);
  file.set_int_attr("/", "version", kVersion);
  for (const auto& [name, t] : params) file.write(name, t.detach().to(Device::cpu()).to(DType::f32).contiguous());
  file.commit();
}

}  // namespace cz
