// Checkpoints of state that lives on a GPU: slices saved from device memory (directly and through the
// background writer's pinned host copy) and read back into device memory through the bounded host buffer.
// Skips without a GPU.
#include <gtest/gtest.h>

#include "checkpoint_testing.h"
#include "io/checkpoint/checkpoint.h"
#include "io_testing.h"
#include "tensor/cuda_test_util.h"

namespace cz {
namespace {

TEST(CheckpointCuda, DeviceSlicesRoundTrip) {
  CZ_REQUIRE_GPU();
  // One tensor larger than the 1 Mi-element host buffer that reads into device memory go through.
  testing::TensorList tensors = testing::small_model();
  tensors.push_back({"stages.3.blocks.0.mlp.fc1.weight", {1536, 768}});
  const FlatLayout layout = testing::flat_layout(tensors, 16);
  for (const bool background : {false, true}) {
    testing::TempDir dir;
    const auto errors = testing::run_ranks(2, [&](int rank, ckpt::Collective& comm) {
      ckpt::SaveRequest r{.dir = dir.path().string(), .step = 4, .stage = 3};
      r.groups = testing::rank_state(tensors, layout, 2, rank, 4, {"params", "exp_avg"});
      for (ckpt::StateGroup& g : r.groups)
        for (ckpt::ShardSlice& s : g.slices) s.local = s.local.to(testing::gpu());
      r.tensors = testing::infos(tensors);
      if (background)
        ckpt::begin_save(std::move(r), comm).finish();
      else
        ckpt::save_checkpoint(std::move(r), comm);
    });
    for (const std::string& e : errors) ASSERT_EQ(e, "");
    const ckpt::Checkpoint c = ckpt::Checkpoint::open(dir.path().string());
    for (int rank = 0; rank < 3; ++rank)
      for (const ckpt::StateGroup& g :
           testing::rank_state(tensors, layout, 3, rank, 0, {"params", "exp_avg"})) {
        std::vector<ckpt::ShardSlice> slices = testing::blank_like(g.slices);
        for (ckpt::ShardSlice& s : slices) s.local = s.local.to(testing::gpu());
        c.read_slices(g.name, slices);
        for (const ckpt::ShardSlice& s : slices)
          EXPECT_EQ(testing::count_wrong(s, tensors, 4, g.name), 0) << s.name;
      }
  }
}

}  // namespace
}  // namespace cz
