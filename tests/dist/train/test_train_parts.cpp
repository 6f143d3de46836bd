// The trainer's parts on their own: the data feed's position and a feed resumed at it, the step boundary's
// agreement at one rank (the save's state, the stop before the job's end).
#include <chrono>

#include "dist/train/data_feed.h"
#include "dist/train/stop.h"
#include "trainer_testing.h"

namespace cz::train {
namespace {

TEST(DataFeed, ResumedAtItsPositionGivesTheSameBatches) {
  TrainConfig c = testing::tiny_config();
  c.num_classes = kClassesOfTheData;
  const dist::World& world = dist::World::get();
  const Device cpu = Device::cpu();
  DataFeed a(c, world, cpu);
  EXPECT_TRUE(a.classes_from_data());
  EXPECT_EQ(c.num_classes, 4);
  ASSERT_NE(a.eval_set(), nullptr);  // the synthetic source's own eval split
  // 256 examples in batches of 16: 16 batches an epoch, so the 18th is the second of epoch 1.
  ASSERT_EQ(a.batches_per_epoch(), 16);
  for (int i = 0; i < 18; ++i) a.next();
  EXPECT_EQ(a.epoch(), 1);
  EXPECT_EQ(a.samples_in_epoch(), 2 * 16);

  TrainConfig d = testing::tiny_config();
  DataFeed b(d, world, cpu);
  b.start_at(a.epoch(), a.samples_in_epoch());
  for (int i = 0; i < 3; ++i) {
    const Batch x = a.next(), y = b.next();
    EXPECT_EQ(x.epoch, y.epoch);
    EXPECT_EQ(x.next_position, y.next_position);
    EXPECT_EQ(x.labels.to_vector<int64_t>(), y.labels.to_vector<int64_t>());
    EXPECT_EQ(x.pixels.to_vector<uint8_t>(), y.pixels.to_vector<uint8_t>());
  }
  EXPECT_EQ(a.samples_in_epoch(), b.samples_in_epoch());
}

TEST(StepBoundary, AgreesOnTheSaveAndStopsBeforeTheJobsEnd) {
  StepBoundary b(dist::ProcessGroup(Device::cpu()), /*end_margin=*/30);
  StepBoundary::Agreement a = b.agree(1, /*unwritten=*/false);
  EXPECT_EQ(a.signal, 0);
  EXPECT_TRUE(a.written);
  EXPECT_FALSE(b.agree(1, /*unwritten=*/true).written);
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  b.set_job_end_time(now + 100);
  b.step_took(10);
  EXPECT_EQ(b.agree(2, false).signal, 0);  // 100 s left, a 10 s step, a 30 s margin: go on
  b.step_took(5);                          // the slowest step counts
  EXPECT_EQ(b.agree(3, false).signal, 0);
  b.step_took(80);
  EXPECT_EQ(b.agree(4, false).signal, kStopJobEnd);  // the next step would end inside the margin
}

}  // namespace
}  // namespace cz::train
