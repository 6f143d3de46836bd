// How long `--plan` takes to answer: the planner's replay of one step of ConvNeXt-XL (350M parameters, the
// largest model) at stage 3 on 8 ranks, alone and with the largest-micro-batch search a GPU's memory asks for
// (--gpu-mem), beside the same for atto.
#include <benchmark/benchmark.h>

#include <string>

#include "dist/plan/planner.h"
#include "dist/train/plan_request.h"

namespace {

cz::plan::PlanRequest request(const std::string& model, bool search) {
  cz::train::TrainConfig c;
  c.model = model;
  c.image_size = 224;
  c.micro_batch = 32;
  c.device = "cuda";
  c.precision = "bf16";
  c.stage = 3;
  cz::plan::PlanRequest r = cz::train::plan_request(c, 8);
  if (search) r.gpu_mem = int64_t(24) << 30;
  return r;
}

void BM_plan(benchmark::State& state, const std::string& model, bool search) {
  const cz::plan::PlanRequest r = request(model, search);
  for (auto _ : state) benchmark::DoNotOptimize(cz::plan::make_plan(r).total_bytes);
}

BENCHMARK_CAPTURE(BM_plan, atto, std::string("atto"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_plan, atto_search_24GiB, std::string("atto"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_plan, xlarge, std::string("xlarge"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_plan, xlarge_search_24GiB, std::string("xlarge"), true)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
