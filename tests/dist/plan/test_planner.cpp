// The planner's interface: memory sizes and their errors, the JSON's keys, the rows adding up, the largest
// micro-batch being the largest that fits, and answering for the largest model in well under a second.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "dist/comm/topology.h"
#include "dist/plan/planner.h"
#include "dist/train/plan_request.h"
#include "plan_testing.h"
#include "tensor/check.h"

namespace cz::plan {
namespace {

std::string error_of(const std::string& size) {
  try {
    parse_memory_size(size, "--gpu-mem");
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PlannerFlags, MemorySizes) {
  EXPECT_EQ(parse_memory_size("24GB"), 24'000'000'000);
  EXPECT_EQ(parse_memory_size("24GiB"), int64_t(24) << 30);
  EXPECT_EQ(parse_memory_size("24gib"), int64_t(24) << 30);
  EXPECT_EQ(parse_memory_size("512MB"), 512'000'000);
  EXPECT_EQ(parse_memory_size("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(parse_memory_size("1.5GiB"), int64_t(3) << 29);
  EXPECT_EQ(parse_memory_size("4096"), 4096);
  EXPECT_EQ(parse_memory_size("80 GB"), 80'000'000'000);
}

TEST(PlannerFlags, BadMemorySizesNameTheFlag) {
  using ::testing::HasSubstr;
  EXPECT_THAT(error_of("0"), HasSubstr("--gpu-mem must be positive"));
  EXPECT_THAT(error_of("0GB"), HasSubstr("--gpu-mem must be positive"));
  EXPECT_THAT(error_of("-8GB"), HasSubstr("--gpu-mem must be positive"));
  EXPECT_THAT(error_of("24XB"), HasSubstr("--gpu-mem: unknown unit 'XB'"));
  EXPECT_THAT(error_of("24 gigs"), HasSubstr("--gpu-mem: unknown unit"));
  EXPECT_THAT(error_of("GB"), HasSubstr("--gpu-mem: 'GB' is not a memory size"));
  EXPECT_THAT(error_of(""), HasSubstr("is not a memory size"));
  EXPECT_THAT(error_of("1.2.3GB"), HasSubstr("is not a memory size"));
}

TEST(PlannerFlags, WorldSizeFromTheLauncher) {
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("PMI_SIZE");
  ::unsetenv("PMIX_SIZE");
  ::unsetenv("MV2_COMM_WORLD_SIZE");
  ::unsetenv("SLURM_NTASKS");
  EXPECT_EQ(launcher_world_size(), 1);
  ::setenv("PMI_SIZE", "6", 1);
  EXPECT_EQ(launcher_world_size(), 6);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_EQ(launcher_world_size(), 4);
  ::setenv("OMPI_COMM_WORLD_SIZE", "four", 1);
  EXPECT_THROW(launcher_world_size(), ValueError);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("PMI_RANK");
  ::unsetenv("PMIX_RANK");
  ::unsetenv("MV2_COMM_WORLD_RANK");
  ::unsetenv("SLURM_PROCID");
  EXPECT_EQ(launcher_rank(), 0);
  ::setenv("PMI_RANK", "3", 1);
  EXPECT_EQ(launcher_rank(), 3);
  ::unsetenv("PMI_RANK");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("PMI_SIZE");
}

train::TrainConfig atto_config() {
  train::TrainConfig c;
  c.model = "atto";
  c.image_size = 64;
  c.micro_batch = 16;
  c.loader_threads = 0;
  return c;
}

PlanRequest atto_request() {
  return train::plan_request(atto_config());
}

Plan plan_of(const train::TrainConfig& c) {
  return make_plan(train::plan_request(c));
}

TEST(Planner, RowsAddUpAndJsonHasOneKeyPerRow) {
  PlanRequest r = atto_request();
  r.gpu_mem = int64_t(1) << 30;
  const Plan p = make_plan(r);
  int64_t sum = 0;
  for (const PlanRow& row : p.rows) {
    EXPECT_GE(row.bytes, 0) << row.key;
    sum += row.bytes;
  }
  EXPECT_EQ(sum, p.total_bytes);
  EXPECT_EQ(p.required_bytes, p.total_bytes);  // the CPU: no driver pages, no context
  const nlohmann::json j = plan_to_json(p);
  EXPECT_EQ(j.at("total_bytes").get<int64_t>(), p.total_bytes);
  EXPECT_TRUE(j.at("fits").get<bool>());
  for (const PlanRow& row : p.rows) EXPECT_EQ(j.at(row.key + "_bytes").get<int64_t>(), row.bytes) << row.key;
  for (const char* key :
       {"parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "master_weights_bytes",
        "activations_stages_0_bytes", "backward_transient_bytes", "comm_buffers_bytes",
        "gather_buffers_bytes", "workspace_bytes", "allocator_rounding_bytes"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j.at("max_micro_batch").size(), 16u);
  // Checkpointing keeps only block inputs in the stages (stages.0 has no downsample, which is not
  // checkpointed); the stem is not checkpointed either.
  const nlohmann::json& saved = j.at("activations_saved_end_of_forward");
  auto bytes = [&](const char* mode, const char* part) { return saved.at(mode).at(part).get<int64_t>(); };
  EXPECT_LT(bytes("checkpointing", "stages.0"), bytes("no_checkpointing", "stages.0") / 8);
  EXPECT_LT(bytes("checkpointing", "stages.3"), bytes("no_checkpointing", "stages.3"));
  EXPECT_EQ(saved.at("checkpointing").at("stem"), saved.at("no_checkpointing").at("stem"));
  EXPECT_EQ(saved.at("no_checkpointing").at("stages.0").get<int64_t>(), p.saved_end_of_forward[0][1].bytes);
  // Without --gpu-mem there is nothing to fit: fits is null.
  EXPECT_TRUE(plan_to_json(make_plan(atto_request())).at("fits").is_null());
}

TEST(Planner, LargestMicroBatchFitsAndOneMoreDoesNot) {
  PlanRequest r = atto_request();
  r.gpu_mem = int64_t(200) << 20;
  const Plan p = make_plan(r);
  ASSERT_EQ(p.max_micro_batch.size(), 16u);
  for (const MaxMicroBatch& m : p.max_micro_batch) {
    SCOPED_TRACE(::testing::Message() << "stage " << m.stage << ", checkpointing " << m.checkpointing
                                      << ", offload " << m.offload);
    ASSERT_GT(m.micro_batch, 0);
    PlanRequest q = r;
    q.max_micro_batch = false;
    q.run.zero.stage = m.stage;
    q.run.checkpointing = m.checkpointing;
    q.run.zero.offload = m.offload;
    q.run.micro_batch = m.micro_batch;
    EXPECT_TRUE(*make_plan(q).fits);
    q.run.micro_batch = m.micro_batch + 1;
    EXPECT_FALSE(*make_plan(q).fits);
  }
  // Checkpointing keeps less, and offload keeps less on the device: at least as many images fit.
  for (size_t i = 0; i < 16; i += 2)
    EXPECT_GE(p.max_micro_batch[i + 1].micro_batch, p.max_micro_batch[i].micro_batch);
  for (size_t i = 0; i < 16; i += 4)
    for (size_t ckpt : {0, 1})
      EXPECT_GE(p.max_micro_batch[i + 2 + ckpt].micro_batch, p.max_micro_batch[i + ckpt].micro_batch);
}

TEST(Planner, MixedPrecisionOnCudaKeepsMasterWeightsApart) {
  train::TrainConfig r = atto_config();
  r.device = "cuda";
  r.precision = "bf16";
  const Plan p = plan_of(r);
  auto row = [&](const std::string& key) {
    for (const PlanRow& x : p.rows)
      if (x.key == key) return x.bytes;
    ADD_FAILURE() << "no row " << key;
    return int64_t(0);
  };
  EXPECT_EQ(row("parameters"), 2 * p.psi);
  EXPECT_EQ(row("master_weights"), 4 * p.psi);
  EXPECT_EQ(row("gradients"), 2 * p.psi + 4 * p.psi);
  EXPECT_EQ(row("optimizer_state"), 8 * p.psi);
  // Four buckets (zero::bucket_elems: at most a quarter of the model), cast to fp32 for the reduce; two in
  // flight during backward, where the peak falls: about 2 x (psi / 4) x 4 bytes (buckets end at parameter
  // boundaries, so they are uneven; padding and size classes on top).
  EXPECT_GT(row("comm_buffers"), p.psi);
  EXPECT_LE(double(row("comm_buffers")), 2.5 * double(p.psi));
  EXPECT_GT(row("workspace"), 0);  // cuBLAS and cuDNN
  EXPECT_GT(p.device_overhead_bytes, 0);
  EXPECT_GT(p.required_bytes, p.total_bytes);
  // On the CPU bf16 is the GEMMs' precision in an fp32 model (Note [bf16 on the CPU]): planned as fp32, with
  // no 16-bit copies; fp16 is refused, as the trainer refuses it.
  r.device = "cpu";
  const Plan cpu_bf16 = plan_of(r);
  r.precision = "fp32";
  const Plan cpu_fp32 = plan_of(r);
  EXPECT_EQ(cpu_bf16.total_bytes, cpu_fp32.total_bytes);
  ASSERT_EQ(cpu_bf16.rows.size(), cpu_fp32.rows.size());
  for (size_t i = 0; i < cpu_bf16.rows.size(); ++i) EXPECT_EQ(cpu_bf16.rows[i].bytes, cpu_fp32.rows[i].bytes);
  r.precision = "fp16";
  EXPECT_THROW(plan_of(r), ValueError);
}

// Note [CUDA graphs for the step]: with graphs captured (auto, one rank, stage 0) the input row holds each
// graph's static copy of a micro-batch's images (compute dtype) and labels and its loss, beside the eager
// step.
TEST(Planner, CudaGraphsHoldStaticCopiesOfTheInput) {
  train::TrainConfig r = atto_config();
  r.device = "cuda";
  r.precision = "bf16";
  r.stage = 0;
  r.cuda_graphs = "off";
  auto input_row = [](const Plan& p) {
    for (const PlanRow& x : p.rows)
      if (x.key == "input_batch") return x.bytes;
    ADD_FAILURE() << "no input_batch row";
    return int64_t(0);
  };
  const Plan off = plan_of(r);
  const int64_t n = r.micro_batch, hw = r.image_size * r.image_size;
  const int64_t copies = n * hw * 3 * 2 + n * 8 + 4;  // bf16 images, i64 labels, the f32 loss
  const int64_t scalars = 8 * 8 + 4;                  // the update's f64 scalars and its f32 overflow flag
  for (const char* mode : {"auto", "on"}) {
    r.cuda_graphs = mode;
    const Plan on = plan_of(r);
    EXPECT_EQ(input_row(on) - input_row(off), copies + scalars) << mode;
    EXPECT_GE(on.total_bytes - off.total_bytes, copies + scalars) << mode;
    EXPECT_LE(on.total_bytes - off.total_bytes, copies + copies / 8 + 5 * 512) << mode;  // size classes
  }
  r.grad_accum = 2;  // two graphs of micro-steps (and the update's, which copies no input)
  const Plan two = plan_of(r);
  r.cuda_graphs = "off";
  EXPECT_EQ(input_row(two) - input_row(plan_of(r)), 2 * copies + scalars);
  r.grad_accum = 1;
  r.stage = 2;  // not captured: nothing held
  r.cuda_graphs = "auto";
  const Plan staged = plan_of(r);
  r.cuda_graphs = "off";
  EXPECT_EQ(staged.total_bytes, plan_of(r).total_bytes);
}

// The largest model's plan, the largest micro-batch search included (bench_planner times it).
TEST(Planner, PlansTheLargestModel) {
  train::TrainConfig c = testing::cuda_bf16_run("xlarge", 32);
  c.stage = 3;
  PlanRequest r = train::plan_request(c, 8);
  r.gpu_mem = int64_t(24) << 30;
  const Plan p = make_plan(r);
  EXPECT_EQ(p.num_params, 348'168'458);  // 1000 classes would be timm's 350,196,968; we plan for 10
  EXPECT_EQ(p.max_micro_batch.size(), 16u);
  EXPECT_GT(p.total_bytes, 0);
}

// The closing summary's word on a plan that differs from the measured peak.
TEST(Planner, PlanDifferenceSaysWhy) {
  Plan p;
  p.world = 2;
  p.device = "cpu";
  p.total_bytes = 80'280'832;
  p.rows = {{"comm_scratch", "communicator ring scratch", 2'503'072}};
  EXPECT_EQ(plan_difference(p, p.total_bytes), "");
  EXPECT_EQ(plan_difference(p, 80'192'256),
            "86.5 KiB high: the communicators' threads grow their ring scratch at times of their own");
  EXPECT_EQ(plan_difference(p, 70'000'000), "9.8 MiB high: not expected, see docs/planning.md");
  EXPECT_EQ(plan_difference(p, 81'000'000), "702.3 KiB low: not expected, see docs/planning.md");
  p.world = 1;  // one rank has no communicator thread
  EXPECT_EQ(plan_difference(p, 80'192'256), "86.5 KiB high: not expected, see docs/planning.md");
  p.device = "cuda";
  EXPECT_EQ(plan_difference(p, 80'192'256), "86.5 KiB high: the plan is not yet checked against a GPU");
  // The caveat goes per row, once a GPU has checked it (checked_cuda_rows()); another row keeps it.
  p.model = "convnext_tiny";
  p.image_size = 224;
  p.micro_batch = 64;
  p.stage = 0;
  p.precision = "bf16";
  const std::vector<CheckedCudaRow> checked = {{"convnext_tiny", 224, 64, 1, 0, "bf16", "H100, test"}};
  EXPECT_EQ(plan_difference(p, 80'192'256, checked),
            "86.5 KiB high: within the 1% this row was checked to (H100, test)");
  EXPECT_EQ(plan_difference(p, 79'000'000, checked), "1.2 MiB high: not expected, see docs/planning.md");
  EXPECT_EQ(plan_difference(p, 81'000'000, checked),
            "702.3 KiB low: within the 1% this row was checked to (H100, test)");
  EXPECT_EQ(plan_difference(p, 82'000'000, checked), "1.6 MiB low: not expected, see docs/planning.md");
  p.micro_batch = 128;
  EXPECT_EQ(plan_difference(p, 80'192'256, checked),
            "86.5 KiB high: the plan is not yet checked against a GPU");
}

// Note [The device a plan is for]: --device wins; else a topology of GPUs, or --gpu-mem, plans CUDA.
TEST(PlannerDevice, GpuQuestionsAreCudaPlansUnlessDeviceSaysOtherwise) {
  using ::testing::HasSubstr;
  const dist::Topology gpus = dist::Topology::load(std::string(CZ_DIST_TEST_DATA) + "/dual_socket_8gpu.json");
  const dist::Topology cpus =
      dist::Topology::load(std::string(CZ_DIST_TEST_DATA) + "/two_hosts_2x2_cpu_1gbit.json");
  EXPECT_TRUE(has_gpu_ranks(gpus));
  EXPECT_FALSE(has_gpu_ranks(cpus));
  EXPECT_EQ(plan_device(std::nullopt, false, nullptr).device, "cpu");
  EXPECT_THAT(plan_device(std::nullopt, false, nullptr).reason, HasSubstr("the default --device"));
  EXPECT_EQ(plan_device(std::nullopt, true, nullptr).device, "cuda");
  EXPECT_THAT(plan_device(std::nullopt, true, nullptr).reason, HasSubstr("--gpu-mem asks about GPU memory"));
  EXPECT_EQ(plan_device(std::nullopt, false, &gpus).device, "cuda");
  EXPECT_THAT(plan_device(std::nullopt, true, &gpus).reason, HasSubstr("ranks are GPUs"));
  EXPECT_EQ(plan_device(std::nullopt, true, &cpus).device, "cpu");  // CPU ranks, whatever --gpu-mem says
  for (const dist::Topology* t : {static_cast<const dist::Topology*>(nullptr), &gpus, &cpus})
    for (bool gpu_mem : {false, true}) {
      EXPECT_EQ(plan_device(std::string("cpu"), gpu_mem, t).device, "cpu");
      EXPECT_EQ(plan_device(std::string("cuda:1"), gpu_mem, t).device, "cuda:1");
      EXPECT_EQ(plan_device(std::string("cpu"), gpu_mem, t).reason, "as --device says");
    }
}

}  // namespace
}  // namespace cz::plan
