// --cpu-gemm at start (cpu_gemm_setup.h).
#include "dist/train/cpu_gemm_setup.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "nn/convnext_gemms.h"
#include "tensor/check.h"
#include "tensor/cpu/gemm_choice.h"
#include "tensor/cpu/row_tiles.h"
#include "tensor/parallel.h"

namespace cz::train {

std::vector<std::string> cpu_gemm_choices() {
  std::vector<std::string> v{"auto"};
  for (cpu::GemmLibrary lib : cpu::kGemmLibraries) v.emplace_back(cpu::gemm_library_name(lib));
  return v;
}

CpuGemmSetup setup_cpu_gemms(const std::string& choice, const nn::ConvNeXtConfig& model, int64_t image,
                             int64_t micro_batch, const dist::ProcessGroup& control) {
  CpuGemmSetup out;
  cpu::GemmPlan plan;
  if (choice != "auto") {
    const auto lib = cpu::parse_gemm_library(choice);
    CZ_CHECK(lib.has_value(), "--cpu-gemm must be one of {}, got '{}'", fmt::join(cpu_gemm_choices(), ", "),
             choice);
    plan.fixed = *lib;
    cpu::set_gemm_plan(plan);
    out.note = fmt::format("{} for every shape (--cpu-gemm {}; {})", choice, choice,
                           cpu::gemm_library_version(*lib));
    return out;
  }
  std::string table_text, note;
  if (control.rank() == 0) {
    // The library calls the step makes (row tiles, weight-gradient blocks: cpu::gemm_calls_as_run).
    std::vector<cpu::GemmShape> shapes;
    for (const cpu::GemmShape& s :
         nn::distinct_gemm_shapes(nn::convnext_step_gemms(model, image, micro_batch)))
      for (const cpu::GemmShape& call : cpu::gemm_calls_as_run(s)) shapes.push_back(call);
    std::sort(shapes.begin(), shapes.end());
    shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
    const std::string path = cpu::default_gemm_cache_path(), key = cpu::gemm_cache_key(cpu_threads());
    const cpu::GemmChoice c = cpu::choose_gemms(shapes, path, key);
    out.warnings = c.warnings;
    if (path.empty()) out.warnings.push_back("no cache file (set CZ_CPU_GEMM_CACHE, XDG_CACHE_HOME or HOME)");
    if (c.cached) {
      table_text = cpu::format_gemm_table(c.table);
      const std::string source =
          c.measured == 0 ? fmt::format("all from {}", path)
                          : fmt::format(
                                "{} measured now in {:.2f} s (a few ms per library on each shape with its "
                                "batch rows cut), {} from {}",
                                c.measured, c.seconds, c.table.size() - size_t(c.measured), path);
      note = fmt::format("auto, per shape: {} shapes of the step at {} threads ({}); {}; other shapes on {}",
                         c.table.size(), cpu_threads(), cpu::summarize_gemm_table(c.table), source,
                         cpu::gemm_library_name(cpu::kDefaultGemmLibrary));
    } else {
      // A choice no later process could find again would make resumed and repeated runs differ.
      note = fmt::format(
          "auto, but the measurements could not be cached: {0} for every shape (as --cpu-gemm {0})",
          cpu::gemm_library_name(cpu::kDefaultGemmLibrary));
    }
  }
  if (control.size() > 1) {
    table_text = control.broadcast(table_text, 0);
    note = control.broadcast(note, 0);
  }
  if (table_text.empty()) {
    plan.fixed = cpu::kDefaultGemmLibrary;
  } else {
    plan.fixed.reset();
    plan.table = cpu::parse_gemm_table(table_text);
  }
  cpu::set_gemm_plan(plan);
  out.note = note;
  return out;
}

}  // namespace cz::train
