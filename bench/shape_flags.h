// The CUDA kernel benchmarks' common flags: the compute dtype, ConvNeXt-T's batch and image size, the timed
// iterations and the --json file.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "tensor/dtype.h"

namespace cz::bench {

struct ShapeFlags {
  std::string dtype = "bf16";
  int64_t batch = 64;
  int64_t image = 224;
  int iters = 10;
  std::string json;
};

// --dtype, --batch, --image and --iters; --json is added by `add_json_flag`, after the program's own flags.
inline void add_shape_flags(CLI::App& app, ShapeFlags& f) {
  app.add_option("--dtype", f.dtype, "compute dtype")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--batch", f.batch, "images")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--image", f.image, "square input size, at least 32")
      ->check(CLI::Range(int64_t(32), int64_t(1) << 20))
      ->capture_default_str();
  app.add_option("--iters", f.iters, "timed iterations")->check(CLI::PositiveNumber)->capture_default_str();
}
inline void add_json_flag(CLI::App& app, ShapeFlags& f) {
  app.add_option("--json", f.json, "also write the results here");
}

// Parses argv into `app`'s flags; on a parse error or --help, exits as CLI11 says.
inline void parse_or_exit(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
}

inline DType parse_dtype(const std::string& s) {  // one of the three add_shape_flags accepts
  return s == "f32" ? DType::f32 : s == "bf16" ? DType::bf16 : DType::f16;
}

}  // namespace cz::bench
