// Helpers for the checkpoint tests: ranks as threads (ThreadCollective), a small model's tensors, their
// ZeRO-like flat partitions, and values that say which step, group, tensor and element they belong to.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint/checkpoint.h"

namespace cz::testing {

// The collectives of `size` ranks run as threads of this process.
class ThreadWorld {
 public:
  explicit ThreadWorld(int size) : size_(size), slots_(size_t(size)) {}
  int size() const { return size_; }
  // Every rank posts a value; each gets all of them once all have posted. Throws after 60 s (a test bug).
  std::vector<std::string> exchange(int rank, std::string value);

 private:
  int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<std::string> slots_, result_;
};

class ThreadCollective final : public ckpt::Collective {
 public:
  ThreadCollective(ThreadWorld& world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  int64_t all_reduce_max(int64_t value) override;
  std::string broadcast(const std::string& value, int root) override {
    return world_.exchange(rank_, value)[size_t(root)];
  }

 private:
  ThreadWorld& world_;
  int rank_;
};

// Runs fn(rank, collective) on `size` threads; returns each rank's exception message ("" when none).
std::vector<std::string> run_ranks(int size, const std::function<void(int, ckpt::Collective&)>& fn);

using TensorList = std::vector<std::pair<std::string, Shape>>;
// A few ConvNeXt-like parameters of awkward shapes (1-D, 2-D, 4-D, one element), ~2.5k elements in all.
TensorList small_model();

std::vector<ckpt::TensorInfo> infos(const TensorList& tensors);
// The layout of `tensors` in a flat buffer with segments aligned to `align` elements (padding between).
FlatLayout flat_layout(const TensorList& tensors, int64_t align);
// [begin, end) of rank `rank`'s equal share of `layout`'s flat buffer.
std::pair<int64_t, int64_t> flat_share(const FlatLayout& layout, int world, int rank);

// The value of element i of tensor `t` of group `group` in the checkpoint of `step`: exact in f32.
float value_at(int64_t step, int group, int t, int64_t i);
int group_id(const std::string& group);        // params 0, exp_avg 1, exp_avg_sq 2, ema 3, momentum_buffer 4
const std::vector<std::string>& all_groups();  // params, exp_avg, exp_avg_sq, ema

// This rank's slices of every group in `groups`, filled with value_at(step, ...), for a flat partition of
// `layout` among `world` ranks.
std::vector<ckpt::StateGroup> rank_state(const TensorList& tensors, const FlatLayout& layout, int world,
                                         int rank, int64_t step, const std::vector<std::string>& groups);
// The number of elements of `slice` (of group `group`) that differ from value_at(step, ...).
int64_t count_wrong(const ckpt::ShardSlice& slice, const TensorList& tensors, int64_t step,
                    const std::string& group);
// Fresh zero-filled slices for a read-back: the same ranges as `like`.
std::vector<ckpt::ShardSlice> blank_like(const std::vector<ckpt::ShardSlice>& like);

ckpt::Scalars global_scalars(int64_t step);
ckpt::Scalars rank_scalars(int64_t step, int rank);

}  // namespace cz::testing
