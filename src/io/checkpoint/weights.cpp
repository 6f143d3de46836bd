// Weight import (timm or original ConvNeXt keys, PyTorch shapes) and export (timm keys), over
// io/h5/h5_file.h.
#include "io/checkpoint/weights.h"

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "io/h5/h5_file.h"
#include "tensor/autograd/engine.h"

namespace cz {
namespace {

constexpr const char* kFormat = "convnext_zero.weights";
constexpr int64_t kVersion = 1;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

bool skipped(const std::string& name, const WeightImportOptions& opt) {
  return std::any_of(opt.skip_prefixes.begin(), opt.skip_prefixes.end(),
                     [&](const std::string& p) { return starts_with(name, p); });
}

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (size_t dot = s.find('.'); dot != std::string::npos; dot = s.find('.', begin)) {
    parts.push_back(s.substr(begin, dot - begin));
    begin = dot + 1;
  }
  parts.push_back(s.substr(begin));
  return parts;
}

std::string join_dots(const std::vector<std::string>& parts, size_t from) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) out += (i > from ? "." : "") + parts[i];
  return out;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() <= 9 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         (s == "0" || s[0] != '0');
}

// The file shape is acceptable for a parameter of `expected` shape: equal, or a linear layer stored as the
// 1x1 convolution (out, in, 1, 1) of timm's conv-MLP variants, or a GRN parameter (C) stored as the
// original ConvNeXt V2's (1, 1, 1, C).
bool shape_fits(const Shape& file, const Shape& expected) {
  if (file == expected) return true;
  if (expected.size() == 1 && file.size() == 4)
    return file[0] == 1 && file[1] == 1 && file[2] == 1 && file[3] == expected[0];
  return expected.size() == 2 && file.size() == 4 && file[0] == expected[0] && file[1] == expected[1] &&
         file[2] == 1 && file[3] == 1;
}

bool is_mlp_fc_weight(const std::string& name) {
  return name.ends_with(".mlp.fc1.weight") || name.ends_with(".mlp.fc2.weight");
}

std::string describe(const h5::DatasetInfo& info) {
  return fmt::format("{} {}", dtype_name(info.dtype), shape_str(info.shape));
}

// What a file key is read as: the file key itself, its name in the chosen key style, and its dataset info (or
// why that could not be read).
struct FileEntry {
  std::string key;
  std::string name;
  h5::DatasetInfo info;
  std::string unreadable;
};

// Every offender of the file against the model, one line each; empty when the file fits.
std::vector<std::string> mismatches(const std::vector<FileEntry>& entries, const NamedTensorList& params,
                                    const WeightImportOptions& options,
                                    std::map<std::string, const FileEntry*>& by_name) {
  std::set<std::string> model_names;
  for (const auto& [name, t] : params) model_names.insert(name);
  std::vector<std::string> problems;
  for (const FileEntry& e : entries) {
    if (skipped(e.name, options)) continue;
    const std::string found = e.unreadable.empty() ? describe(e.info) : e.unreadable;
    if (!model_names.count(e.name)) {
      problems.push_back(fmt::format("unexpected: {} ({})", e.key, found));
    } else if (by_name.count(e.name)) {
      problems.push_back(
          fmt::format("duplicate: {} and {} are both read as {}", by_name[e.name]->key, e.key, e.name));
    } else {
      by_name[e.name] = &e;
    }
  }
  for (const auto& [name, t] : params) {
    if (skipped(name, options)) continue;
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      problems.push_back(fmt::format("missing: {} (expected {})", name, shape_str(t.sizes())));
      continue;
    }
    const FileEntry& e = *it->second;
    if (!e.unreadable.empty())
      problems.push_back(fmt::format("unreadable: {}: {}", e.key, e.unreadable));
    else if (!is_floating(e.info.dtype))
      problems.push_back(
          fmt::format("wrong type: {}: file has {}, expected a float dataset", e.key, describe(e.info)));
    else if (!shape_fits(e.info.shape, t.sizes()))
      problems.push_back(fmt::format("wrong shape: {}: file has {}, expected {}", e.key, describe(e.info),
                                     shape_str(t.sizes())));
  }
  return problems;
}

}  // namespace

std::optional<std::string> timm_key_from_facebook(const std::string& key) {
  // Parsed by hand rather than with std::regex, whose recursive matcher can exhaust the stack on the long
  // names a damaged or hostile file may hold.
  const std::vector<std::string> p = split_dots(key);
  if (p[0] == "downsample_layers" && p.size() >= 4 && is_index(p[1]) && (p[2] == "0" || p[2] == "1")) {
    if (p[1] == "0") return fmt::format("stem.{}.{}", p[2], join_dots(p, 3));
    return fmt::format("stages.{}.downsample.{}.{}", p[1], p[2], join_dots(p, 3));
  }
  if (p[0] == "stages" && p.size() >= 4 && is_index(p[1]) && is_index(p[2])) {
    static const std::map<std::string, std::string> names = {
        {"dwconv", "conv_dw"}, {"norm", "norm"}, {"pwconv1", "mlp.fc1"}, {"pwconv2", "mlp.fc2"}};
    const std::string block = fmt::format("stages.{}.blocks.{}.", p[1], p[2]);
    if (p[3] == "gamma" && p.size() == 4) return block + "gamma";
    if (p[3] == "grn" && p.size() == 5 && (p[4] == "gamma" || p[4] == "beta"))  // ConvNeXt V2
      return block + (p[4] == "gamma" ? "mlp.grn.weight" : "mlp.grn.bias");
    auto it = names.find(p[3]);
    if (it != names.end() && p.size() >= 5) return block + it->second + "." + join_dots(p, 4);
    return std::nullopt;
  }
  if (p[0] == "norm" && p.size() >= 2) return "head.norm." + join_dots(p, 1);
  if (p[0] == "head" && p.size() == 2) return "head.fc." + p[1];
  return std::nullopt;
}

std::optional<WeightArchitecture> infer_architecture(
    const std::vector<std::pair<std::string, Shape>>& shapes) {
  std::map<std::string, Shape> by_name;  // timm names
  for (const auto& [key, shape] : shapes) {
    std::string name = starts_with(key, "module.") ? key.substr(7) : key;
    // Safe on timm keys too: none of them has a facebookresearch form.
    if (auto timm = timm_key_from_facebook(name)) name = *timm;
    by_name.emplace(name, shape);
  }
  auto shape_of = [&](const std::string& name) -> const Shape* {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : &it->second;
  };
  const Shape* stem = shape_of("stem.0.weight");
  if (!stem || stem->size() != 4) return std::nullopt;
  std::map<int64_t, std::set<int64_t>> blocks;  // stage -> the block indices present
  for (const auto& [name, shape] : by_name) {
    const std::vector<std::string> p = split_dots(name);
    if (p.size() >= 5 && p[0] == "stages" && is_index(p[1]) && p[2] == "blocks" && is_index(p[3]))
      blocks[std::stoll(p[1])].insert(std::stoll(p[3]));
  }
  if (blocks.empty()) return std::nullopt;
  WeightArchitecture a;
  a.source = "shapes";
  a.in_chans = (*stem)[1];
  for (int64_t i = 0; i < int64_t(blocks.size()); ++i) {
    auto it = blocks.find(i);
    if (it == blocks.end() || *it->second.rbegin() + 1 != int64_t(it->second.size()))
      return std::nullopt;  // a stage or a block missing in between
    a.depths.push_back(int64_t(it->second.size()));
    const Shape* dw = shape_of(fmt::format("stages.{}.blocks.0.conv_dw.weight", i));
    if (!dw || dw->size() != 4 || (*dw)[1] != 1 || (*dw)[2] != (*dw)[3]) return std::nullopt;
    a.dims.push_back((*dw)[0]);
    if (i == 0) a.kernel = (*dw)[2];
  }
  if (a.dims[0] != (*stem)[0]) return std::nullopt;
  const Shape* fc1 = shape_of("stages.0.blocks.0.mlp.fc1.weight");
  a.conv_mlp = fc1 && fc1->size() == 4;
  a.layer_scale = shape_of("stages.0.blocks.0.gamma") != nullptr;
  a.grn = shape_of("stages.0.blocks.0.mlp.grn.weight") != nullptr;
  if (const Shape* fc = shape_of("head.fc.weight"); fc && fc->size() == 2) a.num_classes = (*fc)[0];
  return a;
}

namespace {
bool same_model(const WeightArchitecture& a, const WeightArchitecture& b) {
  return a.depths == b.depths && a.dims == b.dims && a.num_classes == b.num_classes &&
         a.in_chans == b.in_chans && a.kernel == b.kernel && a.conv_mlp == b.conv_mlp &&
         a.layer_scale == b.layer_scale && a.grn == b.grn;
}

std::string describe(const WeightArchitecture& a) {
  return fmt::format("depths ({}) dims ({}) {} classes, {} input channels, kernel {}{}{}{}",
                     fmt::join(a.depths, ", "), fmt::join(a.dims, ", "), a.num_classes, a.in_chans, a.kernel,
                     a.conv_mlp ? ", conv MLP" : "", a.layer_scale ? "" : ", no layer scale",
                     a.grn ? ", GRN (V2)" : "");
}

// The architecture attributes export writes; nullopt when the file is not one of ours or predates them.
std::optional<WeightArchitecture> from_attributes(const h5::File& file) {
  try {
    if (file.string_attr("format") != kFormat) return std::nullopt;
    WeightArchitecture a;
    a.source = "attributes";
    a.depths = file.int_attrs("depths");
    a.dims = file.int_attrs("dims");
    a.num_classes = file.int_attr("num_classes");
    a.in_chans = file.int_attr("in_chans");
    a.kernel = file.int_attr("kernel");
    a.conv_mlp = file.int_attr("conv_mlp") != 0;
    a.layer_scale = file.int_attr("layer_scale") != 0;
    a.grn = file.has_attr("grn") && file.int_attr("grn") != 0;  // absent before V2: no GRN
    return a;
  } catch (const IoError&) {
    return std::nullopt;  // an attribute missing: files from other tools, or exported before they were
                          // written
  }
}
}  // namespace

WeightArchitecture read_weight_architecture(const std::string& path, const WeightImportOptions& options) {
  const h5::File file = h5::File::open(path);
  const std::string group = options.group.empty() ? "" : options.group + "/";
  std::vector<std::pair<std::string, Shape>> shapes;
  for (const std::string& key : file.datasets()) {
    if (!starts_with(key, group)) continue;
    try {
      shapes.emplace_back(key.substr(group.size()), file.info(key).shape);
    } catch (const IoError&) {
      // An unreadable dataset says nothing about the model; import reports it.
    }
  }
  const std::optional<WeightArchitecture> inferred = infer_architecture(shapes);
  // The root attributes describe the root's datasets, not those of a group.
  const std::optional<WeightArchitecture> recorded = group.empty() ? from_attributes(file) : std::nullopt;
  if (recorded) {
    CZ_CHECK_IO(!inferred || same_model(*recorded, *inferred),
                "{}: the attributes say {} but the datasets are those of {}", path, describe(*recorded),
                describe(*inferred));
    return *recorded;
  }
  CZ_CHECK_IO(inferred.has_value(),
              "{}: cannot tell which ConvNeXt these weights are for: no architecture attributes, and the {} "
              "datasets{} are not a ConvNeXt's (stem.0.weight and stages.i.blocks.j.conv_dw.weight for every "
              "stage and block, in timm or facebookresearch keys); give the model explicitly",
              path, shapes.size(), group.empty() ? "" : " under " + options.group);
  return *inferred;
}

WeightImportReport import_weights(const std::string& path, const NamedTensorList& params,
                                  const WeightImportOptions& options) {
  // A checkpoint index reads as a weight file through its virtual datasets: their rank files are probed too.
  const h5::File file = h5::File::open(path, {.probe_virtual_sources = true});
  std::map<std::string, const Tensor*> model;
  for (const auto& [name, t] : params) {
    CZ_ASSERT(t.defined() && !model.count(name), "import_weights: parameter '{}' undefined or listed twice",
              name);
    model[name] = &t;
  }

  // Read every key both ways; the style is whichever maps more keys onto the model's names.
  const std::string group = options.group.empty() ? "" : options.group + "/";
  std::vector<FileEntry> as_timm, as_facebook;
  int64_t timm_hits = 0, facebook_hits = 0;
  for (const std::string& key : file.datasets()) {
    if (!starts_with(key, group)) continue;
    std::string bare = key.substr(group.size());
    if (starts_with(bare, "module.")) bare = bare.substr(7);  // saved from a DistributedDataParallel wrapper
    FileEntry e{key, bare, {}, {}};
    try {
      e.info = file.info(key);
    } catch (const IoError& err) {
      e.unreadable = err.what();
    }
    timm_hits += model.count(bare);
    as_timm.push_back(e);
    if (auto name = timm_key_from_facebook(bare)) e.name = *name;
    facebook_hits += model.count(e.name);
    as_facebook.push_back(std::move(e));
  }
  const bool facebook = facebook_hits > timm_hits;
  const std::vector<FileEntry>& entries = facebook ? as_facebook : as_timm;

  std::map<std::string, const FileEntry*> by_name;
  const std::vector<std::string> problems = mismatches(entries, params, options, by_name);
  CZ_CHECK_IO(problems.empty(),
              "{}: weights do not fit the model ({} datasets{}, read as {} keys); {} problem(s):\n  {}", path,
              entries.size(), group.empty() ? "" : " under " + options.group,
              facebook ? "facebookresearch" : "timm", problems.size(), fmt::join(problems, "\n  "));

  // Read everything before writing anything, so a read failing part-way leaves the model untouched.
  std::vector<std::pair<const Tensor*, Tensor>> values;
  for (const auto& [name, t] : params) {
    if (skipped(name, options)) continue;
    Tensor v = file.read(by_name.at(name)->key);
    if (v.sizes() != t.sizes()) v = v.reshape(t.sizes());  // (out, in, 1, 1) -> (out, in)
    values.emplace_back(&t, std::move(v));
  }
  WeightImportReport report;
  report.key_style = facebook ? "facebook" : "timm";
  if (options.group.empty() && file.has_attr("class_names"))
    report.class_names =
        class_names_from_json(file.string_attr("class_names"), path + ": attribute 'class_names'");
  NoGradGuard no_grad;
  for (auto& [t, v] : values) {
    Tensor(*t).copy_(v);
    ++report.tensors;
    report.elements += v.numel();
  }
  return report;
}

namespace {
// The f32 host tensor written for parameter `name`, checked.
Tensor exported_tensor(const std::string& path, const std::string& name, const Tensor& t,
                       const WeightExportOptions& options) {
  CZ_CHECK(!name.empty(), "{}: cannot export: a parameter name is empty", path);
  CZ_CHECK(t.defined(), "{}: cannot export: parameter '{}' is undefined", path, name);
  CZ_CHECK_DTYPE(is_floating(t.dtype()), "{}: cannot export: parameter '{}' is {}, not a float tensor", path,
                 name, dtype_name(t.dtype()));
  Tensor v = t.detach().to(Device::cpu()).to(DType::f32).contiguous();
  if (options.conv_mlp && v.dim() == 2 && is_mlp_fc_weight(name)) v = v.view({v.size(0), v.size(1), 1, 1});
  return v;
}
}  // namespace

WeightFileWriter::WeightFileWriter(const std::string& path, const WeightExportOptions& options)
    : file_(h5::File::create(path)), options_(options) {
  file_.set_attr("format", std::string(kFormat));
  file_.set_attr("version", kVersion);
}

void WeightFileWriter::add(const std::string& name, const Tensor& t) {
  CZ_CHECK(names_.insert(name).second, "{}: cannot export: parameter name '{}' is repeated", file_.path(),
           name);
  const Tensor v = exported_tensor(file_.path(), name, t, options_);
  file_.write(name, v);
  shapes_.emplace_back(name, v.sizes());
}

void WeightFileWriter::commit() {
  if (!options_.class_names.empty()) file_.set_attr("class_names", class_names_to_json(options_.class_names));
  if (const std::optional<WeightArchitecture> a = infer_architecture(shapes_)) {
    file_.set_attr("depths", a->depths);
    file_.set_attr("dims", a->dims);
    file_.set_attr("num_classes", a->num_classes);
    file_.set_attr("in_chans", a->in_chans);
    file_.set_attr("kernel", a->kernel);
    file_.set_attr("conv_mlp", int64_t{a->conv_mlp});
    file_.set_attr("layer_scale", int64_t{a->layer_scale});
    file_.set_attr("grn", int64_t{a->grn});
  }
  file_.commit();
}

void export_weights(const std::string& path, const NamedTensorList& params,
                    const WeightExportOptions& options) {
  // Check and convert everything first: a bad parameter must not cost the user an existing file.
  std::set<std::string> names;
  NamedTensorList host;
  for (const auto& [name, t] : params) {
    CZ_CHECK(names.insert(name).second, "{}: cannot export: parameter name '{}' is empty or repeated", path,
             name);
    host.emplace_back(name, exported_tensor(path, name, t, options));
  }
  // The tensors are already in their exported shapes.
  WeightFileWriter writer(path, {.conv_mlp = false, .class_names = options.class_names});
  for (const auto& [name, t] : host) writer.add(name, t);
  writer.commit();
}

std::string class_names_to_json(const std::vector<std::string>& names) {
  // Folder names are bytes; one that is not UTF-8 is written with U+FFFD in place of its bad bytes (the
  // checks compare names after this round trip).
  return nlohmann::json(names).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<std::string> class_names_from_json(const std::string& json, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  CZ_CHECK_IO(
      j.is_array() && std::all_of(j.begin(), j.end(), [](const nlohmann::json& v) { return v.is_string(); }),
      "{}: expected a JSON array of class names, found '{}'", where, json.substr(0, 200));
  return j.get<std::vector<std::string>>();
}

}  // namespace cz
