// GPU health without a GPU (issue 53): NVML's reading through the stand-in library (fake_nvml.c, whose values
// come from $CZ_FAKE_NVML), the interval summary and the throttling line (Note [GPU health fields]), the
// sampler thread, and the TensorBoard scalars the fields become.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "dist/comm/nvml.h"
#include "dist/train/gpu_health.h"
#include "io/log/tensorboard.h"

using namespace cz;
using namespace cz::train;
using dist::GpuReading;
namespace reason = dist::nvml_reason;

namespace {

struct FakeNvml : ::testing::Test {
  void SetUp() override {
    setenv("CZ_NVML_LIBRARY", CZ_FAKE_NVML_PATH, 1);
    unsetenv("CZ_FAKE_NVML");
  }
  void TearDown() override {
    unsetenv("CZ_NVML_LIBRARY");
    unsetenv("CZ_FAKE_NVML");
  }
};

nlohmann::json train_record(int64_t step, double step_time_s) {
  return {{"split", "train"}, {"step", step}, {"step_time_s", step_time_s}};
}

GpuReading reading(int64_t reasons, double power_w = 300, double clock = 2520) {
  GpuReading r;
  r.util_pct = 90;
  r.mem_util_pct = 40;
  r.mem_used_bytes = 10e9;
  r.mem_total_bytes = 24e9;
  r.temp_c = 70;
  r.power_w = power_w;
  r.power_limit_w = 450;
  r.sm_clock_mhz = clock;
  r.reasons = reasons;
  return r;
}

}  // namespace

TEST(GpuHealth, ReasonNames) {
  EXPECT_EQ(dist::nvml_reason_names(0), "none");
  EXPECT_EQ(dist::nvml_reason_names(reason::kSwPowerCap | reason::kGpuIdle), "gpu_idle,sw_power_cap");
  EXPECT_EQ(dist::nvml_reason_names(reason::kHwThermalSlowdown | 0x10000), "hw_thermal_slowdown,0x10000");
}

TEST_F(FakeNvml, ReadsTheStandIn) {
  setenv("CZ_FAKE_NVML",
         "util=55,mem_util=12,mem_used_mib=2048,temp=71,power_mw=123456,limit_mw=450000,"
         "sm_mhz=1980,reasons=36",
         1);
  std::string why;
  auto nvml = dist::Nvml::open(&why);
  ASSERT_TRUE(nvml) << why;
  EXPECT_EQ(nvml->driver_version(), "999.99.fake");
  void* dev = nvml->device("0000:01:00.0", 0, &why);  // no such bus id: falls back to the index
  ASSERT_TRUE(dev) << why;
  EXPECT_EQ(nvml->device_name(dev), "Fake GPU");
  const GpuReading r = nvml->read(dev);
  EXPECT_EQ(r.util_pct, 55);
  EXPECT_EQ(r.mem_util_pct, 12);
  EXPECT_EQ(r.mem_used_bytes, 2048.0 * (1 << 20));
  EXPECT_EQ(r.temp_c, 71);
  EXPECT_DOUBLE_EQ(r.power_w, 123.456);
  EXPECT_EQ(r.power_limit_w, 450);
  EXPECT_EQ(r.sm_clock_mhz, 1980);
  EXPECT_EQ(r.reasons, 36);  // sw_power_cap | sw_thermal_slowdown
  EXPECT_FALSE(nvml->device("", 3, &why));
  EXPECT_NE(why.find("no device 3"), std::string::npos) << why;
  // A figure the device does not report stays unknown.
  setenv("CZ_FAKE_NVML", "power_mw=-1", 1);
  EXPECT_LT(nvml->read(dev).power_w, 0);
}

TEST_F(FakeNvml, MissingLibraryIsNoError) {
  setenv("CZ_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  std::string why;
  EXPECT_FALSE(dist::Nvml::open(&why));
  EXPECT_NE(why.find("cannot load /nonexistent/libnvidia-ml.so.1"), std::string::npos) << why;
  EXPECT_FALSE(start_gpu_health(false, -1, 1));  // a CPU rank: nothing started, nothing thrown
  unsetenv("CZ_NVML_LIBRARY");
  EXPECT_FALSE(start_gpu_health(false, -1, 1));
}

TEST(GpuHealth, IntervalSummaryAndThrottling) {
  GpuHealthTracker t("rank 0: GPU 0");
  // No readings yet: no fields, the step counted for the next interval.
  nlohmann::json r1 = train_record(1, 0.10);
  EXPECT_FALSE(t.annotate(r1));
  EXPECT_FALSE(r1.contains("gpu_samples"));
  t.add(reading(reason::kGpuIdle, 300, 2500));
  t.add(reading(0, 320, 2540));
  nlohmann::json r2 = train_record(2, 0.10);
  EXPECT_FALSE(t.annotate(r2));
  EXPECT_EQ(r2["gpu_samples"], 2);
  EXPECT_DOUBLE_EQ(r2["gpu_power_w"].get<double>(), 310);
  EXPECT_DOUBLE_EQ(r2["gpu_sm_clock_mhz"].get<double>(), 2520);
  EXPECT_DOUBLE_EQ(r2["gpu_mem_used_gb"].get<double>(), 10);
  EXPECT_EQ(r2["gpu_throttle"], 0);
  EXPECT_EQ(r2["gpu_clock_reasons"], "gpu_idle");  // idle is no throttling
  // Power cap: the line names the reason and the step time before (0.10) and after (mean of 0.12, 0.14).
  nlohmann::json r3 = train_record(3, 0.12);
  EXPECT_FALSE(t.annotate(r3));
  t.add(reading(reason::kSwPowerCap, 449, 2100));
  nlohmann::json r4 = train_record(4, 0.14);
  const auto line = t.annotate(r4);
  ASSERT_TRUE(line);
  EXPECT_EQ(
      *line,
      "rank 0: GPU 0 started throttling by step 4: sw_power_cap (power 449 W of its 450 W cap, 70 C, SM "
      "2100 MHz); step time 0.1000 s before, 0.1300 s after");
  EXPECT_EQ(r4["gpu_throttle"], 1);
  // Still throttling (thermal now): no second line. Then clear: one line.
  t.add(reading(reason::kHwThermalSlowdown));
  nlohmann::json r5 = train_record(5, 0.15);
  EXPECT_FALSE(t.annotate(r5));
  t.add(reading(0));
  nlohmann::json r6 = train_record(6, 0.10);
  const auto cleared = t.annotate(r6);
  ASSERT_TRUE(cleared);
  EXPECT_EQ(*cleared, "rank 0: GPU 0 stopped throttling by step 6; step time 0.1000 s now");
  // Eval records are left alone.
  nlohmann::json eval = {{"split", "eval"}, {"step", 6}, {"loss", 1.0}};
  t.add(reading(0));
  EXPECT_FALSE(t.annotate(eval));
  EXPECT_FALSE(eval.contains("gpu_samples"));
}

TEST(GpuHealth, FieldsReachTensorBoard) {
  GpuHealthTracker t("rank 0: GPU 0");
  t.add(reading(reason::kSwPowerCap));
  nlohmann::json r = train_record(1, 0.1);
  t.annotate(r);
  std::map<std::string, double> tags;
  for (const auto& s : log_record_scalars(r)) tags[s.tag] = s.value;
  EXPECT_EQ(tags.at("train/gpu_util_pct"), 90);
  EXPECT_EQ(tags.at("train/gpu_temp_c"), 70);
  EXPECT_EQ(tags.at("train/gpu_power_limit_w"), 450);
  EXPECT_EQ(tags.at("train/gpu_throttle"), 1);
  EXPECT_FALSE(tags.count("train/gpu_clock_reasons"));  // a string
}

// The sampler thread against the stand-in, which starts throttling (power cap) 0.3 s after nvmlInit_v2.
TEST_F(FakeNvml, SamplerSeesThrottlingStart) {
  setenv("CZ_FAKE_NVML",
         "power_mw=300000,after_s=0.3,reasons_after=4,power_mw_after=449000,sm_mhz_after=2100", 1);
  setenv("CZ_GPU_HEALTH_PERIOD_S", "0.02", 1);
  auto health = start_gpu_health(false, -1, 0);
  unsetenv("CZ_GPU_HEALTH_PERIOD_S");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->device_name(), "Fake GPU");
  // Until the first line (5 s at most, for a loaded machine); every step takes 0.05 s.
  std::vector<std::string> lines;
  int64_t step = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (lines.empty() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    nlohmann::json r = train_record(++step, 0.05);
    if (auto line = health->annotate(r)) lines.push_back(*line);
  }
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("rank 0: GPU 0 started throttling by step"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("sw_power_cap (power 449 W of its 450 W cap"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("0.0500 s after"), std::string::npos) << lines[0];
}
