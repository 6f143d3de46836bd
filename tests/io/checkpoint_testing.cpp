// Helpers for the checkpoint tests (checkpoint_testing.h).
#include "checkpoint_testing.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace cz::testing {

std::vector<std::string> ThreadWorld::exchange(int rank, std::string value) {
  std::unique_lock lock(mutex_);
  slots_[size_t(rank)] = std::move(value);
  if (++arrived_ == size_) {
    result_ = slots_;
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return result_;
  }
  const int64_t generation = generation_;
  if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != generation; }))
    throw std::runtime_error("ThreadWorld: a rank never joined the collective");
  return result_;
}

int64_t ThreadCollective::all_reduce_max(int64_t value) {
  int64_t most = value;
  for (const std::string& v : world_.exchange(rank_, std::to_string(value)))
    most = std::max<int64_t>(most, std::stoll(v));
  return most;
}

std::vector<std::string> run_ranks(int size, const std::function<void(int, ckpt::Collective&)>& fn) {
  ThreadWorld world(size);
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      ThreadCollective comm(world, r);
      try {
        fn(r, comm);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

TensorList small_model() {
  return {{"stem.0.weight", {8, 3, 4, 4}},
          {"stem.0.bias", {8}},
          {"stages.0.blocks.0.conv_dw.weight", {8, 1, 7, 7}},
          {"stages.0.blocks.0.gamma", {8}},
          {"stages.0.blocks.0.mlp.fc1.weight", {32, 8}},
          {"stages.0.blocks.0.mlp.fc2.weight", {8, 32}},
          {"stages.1.downsample.1.weight", {16, 8, 2, 2}},
          {"head.norm.weight", {16}},
          {"head.fc.weight", {10, 16}},
          {"head.fc.bias", {10}},
          {"head.fc.scale", {1}}};
}

std::vector<ckpt::TensorInfo> infos(const TensorList& tensors) {
  std::vector<ckpt::TensorInfo> out;
  for (const auto& [name, shape] : tensors) out.push_back({name, shape});
  return out;
}

FlatLayout flat_layout(const TensorList& tensors, int64_t align) {
  FlatLayout layout;
  layout.align = align;
  int64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    offset = (offset + align - 1) / align * align;
    layout.segments.push_back({name, offset, shape_numel(shape), shape});
    offset += shape_numel(shape);
  }
  layout.numel = (offset + align - 1) / align * align;
  return layout;
}

std::pair<int64_t, int64_t> flat_share(const FlatLayout& layout, int world, int rank) {
  return {layout.numel * rank / world, layout.numel * (rank + 1) / world};
}

float value_at(int64_t step, int group, int t, int64_t i) {
  // Integers below 2^24 are exact in f32; the sign and the fraction make mix-ups of group/tensor visible.
  const int64_t v = (step * 7919 + group * 104729 + t * 1299709 + i * 31) % 4000000;
  return float(v) * (group % 2 ? -0.25f : 0.5f);
}

int group_id(const std::string& group) {
  static const std::vector<std::string> names = {"params", "exp_avg", "exp_avg_sq", "ema", "momentum_buffer"};
  return int(std::find(names.begin(), names.end(), group) - names.begin());
}

const std::vector<std::string>& all_groups() {
  static const std::vector<std::string> names = {"params", "exp_avg", "exp_avg_sq", "ema"};
  return names;
}

namespace {
int tensor_id(const TensorList& tensors, const std::string& name) {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].first == name) return int(i);
  throw std::runtime_error("no tensor " + name);
}
}  // namespace

std::vector<ckpt::StateGroup> rank_state(const TensorList& tensors, const FlatLayout& layout, int world,
                                         int rank, int64_t step, const std::vector<std::string>& groups) {
  const auto [begin, end] = flat_share(layout, world, rank);
  std::vector<ckpt::StateGroup> out;
  for (const std::string& g : groups) {
    Tensor shard = zeros({end - begin});
    std::vector<ckpt::ShardSlice> slices = ckpt::slices_of_flat_range(layout, begin, end, shard);
    for (ckpt::ShardSlice& s : slices) {
      const int t = tensor_id(tensors, s.name);
      float* p = s.local.data<float>();
      for (int64_t i = 0; i < s.numel; ++i) p[i] = value_at(step, group_id(g), t, s.begin + i);
    }
    out.push_back({g, std::move(slices)});
  }
  return out;
}

int64_t count_wrong(const ckpt::ShardSlice& slice, const TensorList& tensors, int64_t step,
                    const std::string& group) {
  const int t = tensor_id(tensors, slice.name);
  const std::vector<float> got = slice.local.cpu().to_vector<float>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < slice.numel; ++i)
    wrong += got[size_t(i)] != value_at(step, group_id(group), t, slice.begin + i);
  return wrong;
}

std::vector<ckpt::ShardSlice> blank_like(const std::vector<ckpt::ShardSlice>& like) {
  std::vector<ckpt::ShardSlice> out;
  for (const ckpt::ShardSlice& s : like) out.push_back({s.name, s.shape, s.begin, s.numel, zeros({s.numel})});
  return out;
}

ckpt::Scalars global_scalars(int64_t step) {
  ckpt::Scalars s;
  s.ints = {{"epoch", step / 3}, {"data_position", step * 64}, {"optimizer_step", step}, {"clean_steps", 7}};
  s.floats = {{"loss_scale", 65536.0}, {"lr", 1e-3 / double(step + 1)}};
  s.strings = {{"config", R"({"model": "convnext_atto", "lr": 0.001, "note": "ünïcode"})"}};
  s.bytes = {{"shuffle_rng", {1, 2, 3, 255, 0, uint8_t(step)}}};
  return s;
}

ckpt::Scalars rank_scalars(int64_t step, int rank) {
  ckpt::Scalars s;
  s.ints = {{"drop_path_offset", step * 100 + rank}};
  s.bytes = {{"drop_path_rng", std::vector<uint8_t>(size_t(17 + rank), uint8_t(rank * 3 + step))}};
  return s;
}

}  // namespace cz::testing
