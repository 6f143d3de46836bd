// --cpu-gemm at start (dist/train/cpu_gemm_setup.h): the plan each value leaves, the cache it reads, and the
// fallback where no cache can be kept.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "dist/train/cpu_gemm_setup.h"
#include "nn/convnext_gemms.h"
#include "tensor/check.h"
#include "tensor/cpu/gemm_choice.h"

namespace cz::train {
namespace {

nn::ConvNeXtConfig small_model() {
  nn::ConvNeXtConfig c;
  c.depths = {1, 1, 1, 1};
  c.dims = {8, 16, 24, 32};
  c.num_classes = 4;
  return c;
}

struct ScopedCache {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("cz_gemm_setup_{}", ::getpid());
  cpu::GemmPlan saved = cpu::gemm_plan();
  explicit ScopedCache(const std::string& file) {
    std::filesystem::remove_all(dir);
    ::setenv("CZ_CPU_GEMM_CACHE", (dir / file).c_str(), 1);
  }
  ~ScopedCache() {
    ::unsetenv("CZ_CPU_GEMM_CACHE");
    cpu::set_gemm_plan(saved);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

TEST(CpuGemmSetup, ANamedLibraryRunsEveryShape) {
  ScopedCache cache("c.tsv");
  const CpuGemmSetup s = setup_cpu_gemms("blis", small_model(), 32, 4, dist::ProcessGroup());
  EXPECT_NE(s.note.find("blis for every shape"), std::string::npos) << s.note;
  EXPECT_EQ(cpu::gemm_library_for({false, true, 123, 45, 67}), cpu::GemmLibrary::blis);
  EXPECT_FALSE(std::filesystem::exists(cache.dir / "c.tsv"));  // nothing measured, nothing written
  EXPECT_THROW(setup_cpu_gemms("mkl", small_model(), 32, 4, dist::ProcessGroup()), ValueError);
}

TEST(CpuGemmSetup, AutoTablesEveryShapeOfTheStepAndCachesThem) {
  ScopedCache cache("c.tsv");
  const std::vector<cpu::GemmShape> shapes =
      nn::distinct_gemm_shapes(nn::convnext_step_gemms(small_model(), 32, 4));
  const CpuGemmSetup first = setup_cpu_gemms("auto", small_model(), 32, 4, dist::ProcessGroup());
  EXPECT_NE(first.note.find(fmt::format("{} shapes of the step", shapes.size())), std::string::npos)
      << first.note;
  EXPECT_NE(first.note.find(fmt::format("{} measured now", shapes.size())), std::string::npos) << first.note;
  EXPECT_TRUE(first.warnings.empty());
  const cpu::GemmPlan plan = cpu::gemm_plan();
  EXPECT_FALSE(plan.fixed.has_value());
  EXPECT_EQ(plan.table.size(), shapes.size());
  // A second start reads them all back: the same table, nothing measured.
  const CpuGemmSetup again = setup_cpu_gemms("auto", small_model(), 32, 4, dist::ProcessGroup());
  EXPECT_NE(again.note.find("all from"), std::string::npos) << again.note;
  EXPECT_EQ(cpu::gemm_plan().table, plan.table);
}

TEST(CpuGemmSetup, AutoWithoutAUsableCacheKeepsTheDefault) {
  ScopedCache cache("f/c.tsv");
  std::filesystem::create_directories(cache.dir);
  std::ofstream(cache.dir / "f") << "a file where the cache's folder should be";
  const CpuGemmSetup s = setup_cpu_gemms("auto", small_model(), 32, 4, dist::ProcessGroup());
  EXPECT_NE(s.note.find("onednn for every shape"), std::string::npos) << s.note;
  EXPECT_FALSE(s.warnings.empty());
  const cpu::GemmPlan plan = cpu::gemm_plan();
  ASSERT_TRUE(plan.fixed.has_value());
  EXPECT_EQ(*plan.fixed, cpu::kDefaultGemmLibrary);
}

TEST(CpuGemmSetup, StepGemmsFollowTheModelConfig) {
  const std::vector<nn::NamedGemm> g = nn::convnext_step_gemms(small_model(), 32, 4);
  // stem (forward, weight grad), 4 stages x 2 layers x 3, 3 downsamples x 3, head x 3
  EXPECT_EQ(g.size(), 2u + 24u + 9u + 3u);
  EXPECT_EQ(g.front().name, "stem forward");
  EXPECT_EQ(g.front().shape, (cpu::GemmShape{false, true, 4 * 8 * 8, 8, 48}));
  for (const nn::NamedGemm& x : g)
    if (x.name == "stage 1 fc2 weight grad")
      EXPECT_EQ(x.shape, (cpu::GemmShape{true, false, 16, 64, 4 * 4 * 4}));
  EXPECT_EQ(g.back().shape, (cpu::GemmShape{true, false, 4, 32, 4}));  // head weight grad over the batch
}

}  // namespace
}  // namespace cz::train
