// libFuzzer target for the weight reader: the input bytes become a file that import_weights reads into a
// small ConvNeXt (the parity fixtures' shape). Any failure must be a cz::Error; anything else, or a crash, is
// a finding. Seeds: tests/data/parity_convnext*.h5 (weights under "weights/"), or files written by
// export_weights.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "io/checkpoint/weights.h"
#include "nn/convnext.h"

namespace {

struct Target {
  std::unique_ptr<cz::nn::ConvNeXt> model;
  cz::NamedTensorList params;
  std::string path;
};

Target& target() {
  static Target t = [] {
    cz::nn::ConvNeXtConfig cfg;
    cfg.depths = {1, 1, 2, 1};
    cfg.dims = {8, 16, 24, 32};
    cfg.num_classes = 10;
    Target made;
    made.model = std::make_unique<cz::nn::ConvNeXt>(cfg);
    made.params = made.model->named_parameters();
    made.path = "/tmp/cz_fuzz_weights_" + std::to_string(::getpid()) + ".h5";
    return made;
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Target& t = target();
  std::FILE* f = std::fopen(t.path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  // Both ways a file is read in practice: the whole file (exported weights), and the fixtures' "weights"
  // group; the second also with the head skipped, as --reset-head does.
  for (int mode = 0; mode < 3; ++mode) {
    cz::WeightImportOptions options;
    if (mode > 0) options.group = "weights";
    if (mode == 2) options.skip_prefixes = {"head.fc."};
    try {
      cz::import_weights(t.path, t.params, options);
    } catch (const cz::Error&) {
    }
  }
  return 0;
}
