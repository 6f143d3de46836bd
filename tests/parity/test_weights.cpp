// Weight files: export/import round trip, key styles (timm, facebookresearch), the 1x1-conv MLP form, f16/f64
// datasets, --reset-head, errors that list every offender and leave the model alone, and crash-safe export.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "common/gradcheck.h"
#include "io/checkpoint/weights.h"
#include "io/h5/h5_file.h"
#include "nn/convnext.h"
#include "tensor/autograd/engine.h"

namespace cz {
namespace {

namespace fs = std::filesystem;

nn::ConvNeXtConfig small_config(int64_t num_classes = 5) {
  nn::ConvNeXtConfig cfg;
  cfg.depths = {1, 2};
  cfg.dims = {8, 16};
  cfg.num_classes = num_classes;
  return cfg;
}

std::map<std::string, Tensor> snapshot(const NamedTensorList& params) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : params) out[name] = t.detach().clone();
  return out;
}

bool equal(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.to_vector<double>() == b.to_vector<double>();
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The original facebookresearch/ConvNeXt key of one of our (timm) names, for writing such files.
std::string facebook_key(const std::string& name) {
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  if (name.rfind("stem.", 0) == 0) return "downsample_layers.0." + name.substr(5);
  if (name.rfind("head.fc.", 0) == 0) return "head." + name.substr(8);
  if (name.rfind("head.norm.", 0) == 0) return "norm." + name.substr(10);
  std::string k = replace(name, ".blocks.", ".");
  if (k.find(".downsample.") != std::string::npos)  // stages.i.downsample.j.* -> downsample_layers.i.j.*
    return "downsample_layers." + replace(k.substr(7), "downsample.", "");
  for (const auto& [ours, theirs] : std::map<std::string, std::string>{
           {"conv_dw", "dwconv"}, {"mlp.fc1", "pwconv1"}, {"mlp.fc2", "pwconv2"}})
    k = replace(k, ours, theirs);
  return k;
}

class Weights : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("cz_weights_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  // Writes `params` under the keys `key_of` gives, in PyTorch shapes (or reshaped by `shape_of`).
  void write(const std::string& path, const NamedTensorList& params,
             const std::function<std::string(const std::string&)>& key_of,
             const std::function<Shape(const std::string&, const Tensor&)>& shape_of = nullptr,
             DType dtype = DType::f32) {
    h5::File f = h5::File::create(path);
    for (const auto& [name, t] : params)
      f.write(key_of(name),
              t.detach().reshape(shape_of ? shape_of(name, t) : t.sizes()).to(dtype).contiguous());
    f.commit();
  }
  fs::path dir_;
};

TEST_F(Weights, ExportThenImportIsExactAndUsesTimmNamesAndPyTorchShapes) {
  nn::ConvNeXt a(small_config()), b(small_config());
  a.init_weights(1);
  b.init_weights(2);
  const std::string path = file("w.h5");
  export_weights(path, a.named_parameters());

  const h5::File f = h5::File::open(path);
  EXPECT_EQ(f.string_attr("format"), "convnext_zero.weights");
  EXPECT_EQ(f.int_attr("version"), 1);
  EXPECT_EQ(f.datasets().size(), a.named_parameters().size());
  EXPECT_EQ(f.info("stem.0.weight").shape, (Shape{8, 3, 4, 4}));
  EXPECT_EQ(f.info("stages.1.downsample.1.weight").shape, (Shape{16, 8, 2, 2}));
  EXPECT_EQ(f.info("stages.0.blocks.0.conv_dw.weight").shape, (Shape{8, 1, 7, 7}));
  EXPECT_EQ(f.info("stages.1.blocks.1.mlp.fc1.weight").shape, (Shape{64, 16}));
  EXPECT_EQ(f.info("head.fc.weight").dtype, DType::f32);

  const WeightImportReport r = import_weights(path, b.named_parameters());
  EXPECT_EQ(r.key_style, "timm");
  EXPECT_EQ(r.tensors, int64_t(a.named_parameters().size()));
  EXPECT_EQ(r.elements, a.num_parameters());
  const auto pb = b.named_parameters();
  for (const auto& [name, t] : a.named_parameters()) {
    const Tensor& other =
        std::find_if(pb.begin(), pb.end(), [&](auto& p) { return p.first == name; })->second;
    EXPECT_TRUE(equal(t, other)) << name;
  }
}

TEST_F(Weights, ConvMlpExportWritesTimmsOneByOneConvShapesAndReadsBack) {
  nn::ConvNeXt a(small_config()), b(small_config());
  a.init_weights(1);
  b.init_weights(2);
  const std::string path = file("w_conv_mlp.h5");
  export_weights(path, a.named_parameters(), {.conv_mlp = true});
  const h5::File f = h5::File::open(path);
  EXPECT_EQ(f.info("stages.1.blocks.1.mlp.fc1.weight").shape, (Shape{64, 16, 1, 1}));
  EXPECT_EQ(f.info("stages.1.blocks.1.mlp.fc2.weight").shape, (Shape{16, 64, 1, 1}));
  EXPECT_EQ(f.info("stages.1.blocks.1.mlp.fc1.bias").shape, (Shape{64}));
  EXPECT_EQ(f.info("head.fc.weight").shape.size(), 2u);  // the classifier stays a linear layer in timm
  import_weights(path, b.named_parameters());
  const auto pb = b.named_parameters();
  for (size_t i = 0; i < pb.size(); ++i) EXPECT_TRUE(equal(a.named_parameters()[i].second, pb[i].second));
}

TEST(WeightKeys, FacebookKeysMapToTimmNames) {
  EXPECT_EQ(timm_key_from_facebook("downsample_layers.0.0.weight"), "stem.0.weight");
  EXPECT_EQ(timm_key_from_facebook("downsample_layers.0.1.bias"), "stem.1.bias");
  EXPECT_EQ(timm_key_from_facebook("downsample_layers.2.1.weight"), "stages.2.downsample.1.weight");
  EXPECT_EQ(timm_key_from_facebook("stages.1.2.pwconv1.bias"), "stages.1.blocks.2.mlp.fc1.bias");
  EXPECT_EQ(timm_key_from_facebook("stages.3.0.dwconv.weight"), "stages.3.blocks.0.conv_dw.weight");
  EXPECT_EQ(timm_key_from_facebook("stages.0.0.gamma"), "stages.0.blocks.0.gamma");
  EXPECT_EQ(timm_key_from_facebook("norm.weight"), "head.norm.weight");
  EXPECT_EQ(timm_key_from_facebook("head.weight"), "head.fc.weight");
  for (const char* k : {"stem.0.weight", "head.fc.weight", "stages.0.0.dwconv", "stages.0.0.gamma.x",
                        "downsample_layers.1.2.weight", "stages.a.0.norm.weight", "", "...", "head"})
    EXPECT_EQ(timm_key_from_facebook(k), std::nullopt) << k;
}

TEST_F(Weights, FacebookKeysAndConvMlpFormAndF16AndF64DatasetsImport) {
  nn::ConvNeXt src(small_config());
  src.init_weights(3);
  const auto params = src.named_parameters();
  auto as_conv = [](const std::string& name, const Tensor& t) {
    return name.find(".mlp.fc") != std::string::npos && t.dim() == 2 ? Shape{t.size(0), t.size(1), 1, 1}
                                                                     : t.sizes();
  };
  write(file("fb.h5"), params, facebook_key);
  write(
      file("convmlp.h5"), params, [](const std::string& n) { return n; }, as_conv);
  write(
      file("f64.h5"), params, [](const std::string& n) { return n; }, nullptr, DType::f64);
  write(
      file("f16.h5"), params, [](const std::string& n) { return n; }, nullptr, DType::f16);

  for (const char* name : {"fb.h5", "convmlp.h5", "f64.h5", "f16.h5"}) {
    nn::ConvNeXt dst(small_config());
    dst.init_weights(4);
    const WeightImportReport r = import_weights(file(name), dst.named_parameters());
    EXPECT_EQ(r.key_style, std::string(name) == "fb.h5" ? "facebook" : "timm") << name;
    const auto got = dst.named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      // f16 files hold the values rounded to half precision; everything else is exact.
      const Tensor expected =
          std::string(name) == "f16.h5" ? params[i].second.to(DType::f16).to(DType::f32) : params[i].second;
      EXPECT_TRUE(equal(got[i].second, expected)) << name << " " << got[i].first;
    }
  }
}

TEST_F(Weights, ErrorListsEveryOffenderAndLeavesTheModelAlone) {
  nn::ConvNeXt src(small_config());
  src.init_weights(5);
  const std::string path = file("bad.h5");
  {
    h5::File f = h5::File::create(path);
    for (const auto& [name, t] : src.named_parameters()) {
      if (name == "stages.0.blocks.0.gamma" || name == "head.norm.bias") continue;  // missing
      if (name == "stem.0.weight")
        f.write(name, zeros({8, 3, 2, 2}));  // wrong shape
      else if (name == "head.fc.bias")
        f.write(name, zeros({5}, DType::i64));  // wrong type
      else
        f.write(name, t.detach().contiguous());
    }
    f.write("stages.0.blocks.7.gamma", zeros({8}));  // unexpected
    f.write("extra/thing", zeros({3}));
    f.commit();
  }
  nn::ConvNeXt dst(small_config());
  dst.init_weights(6);
  const auto before = snapshot(dst.named_parameters());
  try {
    import_weights(path, dst.named_parameters());
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    for (const std::string& part :
         {path, std::string("6 problem(s)"), std::string("missing: stages.0.blocks.0.gamma (expected (8))"),
          std::string("missing: head.norm.bias (expected (16))"),
          std::string("wrong shape: stem.0.weight: file has f32 (8, 3, 2, 2), expected (8, 3, 4, 4)"),
          std::string("wrong type: head.fc.bias: file has i64 (5)"),
          std::string("unexpected: stages.0.blocks.7.gamma (f32 (8))"),
          std::string("unexpected: extra/thing (f32 (3))")})
      EXPECT_NE(msg.find(part), std::string::npos) << part << "\nnot in:\n" << msg;
  }
  for (const auto& [name, t] : dst.named_parameters()) EXPECT_TRUE(equal(t, before.at(name))) << name;
}

TEST_F(Weights, ResetHeadSkipsTheClassifierOfAnotherClassCount) {
  nn::ConvNeXt src(small_config(5));
  src.init_weights(7);
  const std::string path = file("w.h5");
  export_weights(path, src.named_parameters());

  nn::ConvNeXt dst(small_config(7));
  dst.init_weights(8);
  const auto before = snapshot(dst.named_parameters());
  try {
    import_weights(path, dst.named_parameters());
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    EXPECT_NE(
        std::string(e.what()).find("wrong shape: head.fc.weight: file has f32 (5, 16), expected (7, 16)"),
        std::string::npos)
        << e.what();
  }
  WeightImportOptions opt;
  opt.skip_prefixes = {"head.fc."};
  const WeightImportReport r = import_weights(path, dst.named_parameters(), opt);
  EXPECT_EQ(r.tensors, int64_t(dst.named_parameters().size()) - 2);
  const auto from = snapshot(src.named_parameters());
  for (const auto& [name, t] : dst.named_parameters())
    EXPECT_TRUE(equal(t, name.rfind("head.fc.", 0) == 0 ? before.at(name) : from.at(name))) << name;
}

TEST_F(Weights, MissingAndNonHdf5FilesAreNamed) {
  nn::ConvNeXt m(small_config());
  const std::string text = file("notes.txt");
  std::ofstream(text) << "not weights\n";
  for (const auto& [path, reason] : {std::pair{text, std::string("not an HDF5 file")},
                                     std::pair{file("absent.h5"), std::string("No such file")},
                                     std::pair{dir_.string(), std::string("not a regular file")}}) {
    try {
      import_weights(path, m.named_parameters());
      FAIL() << path;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
}

TEST_F(Weights, DamagedFilesFoundByTheFuzzerAreIoErrors) {
  // A header whose metadata size claims 0x3ff0000000 bytes: HDF5's allocation fails and says so.
  nn::ConvNeXt m(small_config());
  const std::string path = std::string(CZ_TEST_DATA_DIR) + "/fuzz_weights_huge_metadata.h5";
  try {
    import_weights(path, m.named_parameters());
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": "), std::string::npos) << e.what();
  }
}

TEST_F(Weights, FailedExportLeavesTheExistingFileAndNoTemporaries) {
  nn::ConvNeXt m(small_config());
  m.init_weights(9);
  const std::string path = file("w.h5");
  export_weights(path, m.named_parameters());
  const std::string original = read_bytes(path);
  auto only_original_left = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    EXPECT_EQ(names, std::vector<std::string>{"w.h5"});
    EXPECT_EQ(read_bytes(path), original);
  };

  // A bad parameter, refused before anything is written.
  NamedTensorList bad = m.named_parameters();
  bad.emplace_back("step", zeros({1}, DType::i64));
  EXPECT_THROW(export_weights(path, bad), DtypeError);
  only_original_left();

  // A failure part-way through writing: "stem.0.weight/x" needs a group where a dataset already is.
  NamedTensorList clash = m.named_parameters();
  clash.emplace_back("stem.0.weight/x", zeros({1}));
  try {
    export_weights(path, clash);
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("stem.0.weight/x"), std::string::npos) << e.what();
  }
  only_original_left();

  // A directory we cannot create files in (only enforced when not running as root).
  EXPECT_THROW(export_weights(file("no/such/dir/w.h5"), m.named_parameters()), IoError);
  fs::permissions(dir_, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                  fs::perm_options::remove);
  if (::geteuid() != 0) {
    EXPECT_THROW(export_weights(path, m.named_parameters()), IoError);
    only_original_left();
  }
}

void expect_architecture(const WeightArchitecture& a, const nn::ConvNeXtConfig& cfg,
                         const std::string& source) {
  EXPECT_EQ(a.source, source);
  EXPECT_EQ(a.depths, cfg.depths);
  EXPECT_EQ(a.dims, cfg.dims);
  EXPECT_EQ(a.num_classes, cfg.num_classes);
  EXPECT_EQ(a.in_chans, cfg.in_chans);
  EXPECT_EQ(a.kernel, cfg.kernel);
  EXPECT_EQ(a.conv_mlp, cfg.conv_mlp);
  EXPECT_EQ(a.layer_scale, cfg.layer_scale_init > 0);
}

// The model cz_weights builds for a file given no --model: the architecture the file describes.
nn::ConvNeXtConfig config_of(const WeightArchitecture& a) {
  nn::ConvNeXtConfig cfg;
  cfg.depths = a.depths;
  cfg.dims = a.dims;
  cfg.num_classes = a.num_classes;
  cfg.in_chans = a.in_chans;
  cfg.kernel = a.kernel;
  cfg.conv_mlp = a.conv_mlp;
  if (!a.layer_scale) cfg.layer_scale_init = 0;
  return cfg;
}

// An atto export (timm's 1x1-conv MLP form, 10 classes) says what it is: cz_weights used to assume
// convnext_tiny with 1000 classes and report 182 wrong shapes.
TEST_F(Weights, AttoExportRecordsItsArchitectureAndLoadsIntoIt) {
  nn::ConvNeXtConfig cfg = nn::convnext_variant("atto");
  cfg.num_classes = 10;
  nn::ConvNeXt a(cfg);
  a.init_weights(1);
  const std::string path = file("atto.h5");
  export_weights(path, a.named_parameters(), {.conv_mlp = true});
  const h5::File f = h5::File::open(path);
  EXPECT_EQ(f.int_attrs("depths"), (std::vector<int64_t>{2, 2, 6, 2}));
  EXPECT_EQ(f.int_attrs("dims"), (std::vector<int64_t>{40, 80, 160, 320}));
  EXPECT_EQ(f.int_attr("num_classes"), 10);
  EXPECT_EQ(f.int_attr("conv_mlp"), 1);
  const WeightArchitecture arch = read_weight_architecture(path);
  expect_architecture(arch, cfg, "attributes");
  nn::ConvNeXt b(config_of(arch));
  EXPECT_EQ(import_weights(path, b.named_parameters()).tensors, int64_t(a.named_parameters().size()));
}

// Custom depths, another kernel, no layer scale, 7 classes: recorded by export, and inferred from the
// datasets alone for files without the attributes, in timm and facebookresearch keys (a `module.` prefix
// too).
TEST_F(Weights, CustomDepthsAreRecordedAndInferredFromShapesWithoutAttributes) {
  nn::ConvNeXtConfig cfg;
  cfg.depths = {1, 3, 2};
  cfg.dims = {8, 16, 24};
  cfg.num_classes = 7;
  cfg.kernel = 5;
  cfg.layer_scale_init = 0;
  nn::ConvNeXt a(cfg);
  a.init_weights(1);
  export_weights(file("ours.h5"), a.named_parameters());
  expect_architecture(read_weight_architecture(file("ours.h5")), cfg, "attributes");

  write(file("timm.h5"), a.named_parameters(), [](const std::string& n) { return "module." + n; });
  expect_architecture(read_weight_architecture(file("timm.h5")), cfg, "shapes");
  write(file("facebook.h5"), a.named_parameters(), facebook_key);
  expect_architecture(read_weight_architecture(file("facebook.h5")), cfg, "shapes");
  nn::ConvNeXt b(config_of(read_weight_architecture(file("facebook.h5"))));
  EXPECT_EQ(import_weights(file("facebook.h5"), b.named_parameters()).key_style, "facebook");

  cfg.conv_mlp = true;  // and the 1x1-conv MLP form, told by the shape of fc1
  write(
      file("conv_mlp.h5"), a.named_parameters(), [](const std::string& n) { return n; },
      [](const std::string& n, const Tensor& t) {
        return n.find(".mlp.fc") != std::string::npos && t.dim() == 2 ? Shape{t.size(0), t.size(1), 1, 1}
                                                                      : t.sizes();
      });
  expect_architecture(read_weight_architecture(file("conv_mlp.h5")), cfg, "shapes");
}

// ConvNeXt V2 (GRN, no layer scale): export records `grn`, timm's keys and 1x1-conv MLP shapes load back,
// and the original ConvNeXt-V2 keys (grn.gamma / grn.beta, stored (1, 1, 1, C)) import and are told apart.
TEST_F(Weights, ConvNeXtV2RoundTripsInTimmAndOriginalKeys) {
  nn::ConvNeXtConfig cfg;
  cfg.depths = {1, 2};
  cfg.dims = {8, 16};
  cfg.num_classes = 3;
  cfg.grn = true;
  cfg.layer_scale_init = 0;
  cfg.conv_mlp = true;
  nn::ConvNeXt a(cfg);
  a.init_weights(1);
  uint64_t seed = 40;
  for (auto& [name, t] : a.named_parameters()) {  // GRN starts at zero: give it values to carry
    if (name.find(".grn.") == std::string::npos) continue;
    NoGradGuard g;
    Tensor(t).copy_(testing::random_tensor(t.sizes(), ++seed, DType::f32));
  }
  export_weights(file("v2.h5"), a.named_parameters(), {.conv_mlp = true});
  EXPECT_EQ(h5::File::open(file("v2.h5")).int_attr("grn"), 1);
  const WeightArchitecture arch = read_weight_architecture(file("v2.h5"));
  expect_architecture(arch, cfg, "attributes");
  EXPECT_TRUE(arch.grn);
  nn::ConvNeXtConfig back = config_of(arch);
  back.grn = arch.grn;
  nn::ConvNeXt b(back);
  import_weights(file("v2.h5"), b.named_parameters());
  const auto want = snapshot(a.named_parameters());
  for (const auto& [name, t] : b.named_parameters()) EXPECT_TRUE(equal(t, want.at(name))) << name;

  EXPECT_EQ(timm_key_from_facebook("stages.2.1.grn.gamma"), "stages.2.blocks.1.mlp.grn.weight");
  EXPECT_EQ(timm_key_from_facebook("stages.2.1.grn.beta"), "stages.2.blocks.1.mlp.grn.bias");
  write(
      file("original.h5"), a.named_parameters(),
      [](const std::string& n) {
        const size_t at = n.find("mlp.grn.");
        if (at == std::string::npos) return facebook_key(n);
        return facebook_key(n.substr(0, at)) + (n.ends_with("weight") ? "grn.gamma" : "grn.beta");
      },
      [](const std::string& n, const Tensor& t) {
        return n.find(".grn.") != std::string::npos ? Shape{1, 1, 1, t.size(0)} : t.sizes();
      });
  EXPECT_TRUE(read_weight_architecture(file("original.h5")).grn);
  nn::ConvNeXt c(back);
  EXPECT_EQ(import_weights(file("original.h5"), c.named_parameters()).key_style, "facebook");
  for (const auto& [name, t] : c.named_parameters()) EXPECT_TRUE(equal(t, want.at(name))) << name;

  nn::ConvNeXtConfig v1 = cfg;  // a V1 model of the same shapes does not take them
  v1.grn = false;
  nn::ConvNeXt d(v1);
  EXPECT_THROW(import_weights(file("v2.h5"), d.named_parameters()), IoError);
}

TEST_F(Weights, ArchitectureErrorsNameTheFileAndWhatIsWrong) {
  nn::ConvNeXt a(small_config());
  a.init_weights(1);
  NamedTensorList gap;  // stages.1.blocks.0 left out: the depths cannot be told
  for (const auto& [name, t] : a.named_parameters())
    if (name.rfind("stages.1.blocks.0.", 0) != 0) gap.emplace_back(name, t);
  write(file("gap.h5"), gap, [](const std::string& n) { return n; });
  try {
    read_weight_architecture(file("gap.h5"));
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("gap.h5: cannot tell which ConvNeXt"), std::string::npos)
        << e.what();
  }
  h5::File f = h5::File::create(file("lying.h5"));  // attributes that contradict the datasets
  for (const auto& [name, t] : a.named_parameters()) f.write(name, t.detach().contiguous());
  f.set_attr("format", std::string("convnext_zero.weights"));
  f.set_attr("depths", std::vector<int64_t>{2, 2});
  f.set_attr("dims", std::vector<int64_t>{8, 16});
  for (const auto& [k, v] : std::map<std::string, int64_t>{
           {"num_classes", 5}, {"in_chans", 3}, {"kernel", 7}, {"conv_mlp", 0}, {"layer_scale", 1}})
    f.set_attr(k, v);
  f.commit();
  try {
    read_weight_architecture(file("lying.h5"));
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("the attributes say depths (2, 2)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("datasets are those of depths (1, 2)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cz
