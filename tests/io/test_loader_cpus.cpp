// LoaderOptions::cpus (Note [CPU threads on a CUDA rank]): the worker threads run on the CPUs given, and the
// consumer's thread keeps its own mask.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <vector>

#include "io/data/loader.h"
#include "tensor/parallel.h"

namespace cz {
namespace {

// Records the affinity mask of every thread that reads an example.
class MaskRecordingDataset : public Dataset {
 public:
  int64_t size() const override { return 16; }
  int64_t num_classes() const override { return 2; }
  int64_t label(int64_t index) const override { return index % 2; }
  std::string describe() const override { return "masks"; }
  void read(int64_t, Image& out) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      masks_.insert(affinity_cpus());
    }
    out.height = out.width = 4;
    out.pixels.assign(4 * 4 * 3, 7);
  }
  std::set<std::vector<int>> masks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return masks_;
  }

 private:
  mutable std::mutex mu_;
  mutable std::set<std::vector<int>> masks_;
};

std::set<std::vector<int>> masks_seen(const std::vector<int>& cpus) {
  auto data = std::make_shared<MaskRecordingDataset>();
  LoaderOptions opt;
  opt.batch_size = 4;
  opt.image_size = 4;
  opt.threads = 2;
  opt.pixels_only = true;
  opt.cpus = cpus;
  Loader loader(data, opt);
  loader.start_epoch(0);
  int batches = 0;
  while (loader.next()) ++batches;
  EXPECT_EQ(batches, 4);
  return data->masks();
}

TEST(LoaderCpus, WorkersRunOnTheCpusGiven) {
  const std::vector<int> mask = affinity_cpus();
  ASSERT_FALSE(mask.empty());
  EXPECT_EQ(masks_seen({mask.back()}), std::set<std::vector<int>>({{mask.back()}}));
  EXPECT_EQ(affinity_cpus(), mask);  // the consumer's thread is not pinned
  // None given: the workers keep the process's mask.
  EXPECT_EQ(masks_seen({}), std::set<std::vector<int>>({mask}));
}

}  // namespace
}  // namespace cz
