// Note [Pinned blocks] (src/tensor/cuda/block_pool.h): the pinned pool stays flat after the first epoch
// while the whole recipe's packed draws change size with every batch. On the CPU, the pool's bookkeeping
// (BlockPool without home streams, a fake system that counts its allocations) replays 200 batches of the
// recipe's draws, the loader's pinned pixels and the step's staging copies, with the trainer's lifetimes; on
// a GPU (skipped without one), the loader, copy_ahead and model_input run 200 batches and the pinned
// allocator's cudaHostAlloc count stops growing after the first epoch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "io/augment/random_erasing.h"
#include "io/data/dataset.h"
#include "io/data/loader.h"
#include "io/data/model_input.h"
#include "io/data/sampler.h"
#include "io_testing.h"
#include "tensor/cuda/block_pool.h"
#include "tensor/cuda/runtime.h"

namespace cz {
namespace {

// A system of two streams (compute, copy) whose work the test finishes, and host memory it counts.
struct CountingSystem {
  std::map<void*, int64_t> queued, done;
  int64_t allocs = 0, frees = 0;
};

struct CountingBackend {
  struct Event {
    void* stream;
    int64_t seq;
  };
  CountingSystem* sys;

  Event record(const Stream& s) { return {s.handle, sys->queued[s.handle]}; }
  bool query(const Event& e) { return sys->done[e.stream] >= e.seq; }
  void synchronize(const Event& e) { sys->done[e.stream] = std::max(sys->done[e.stream], e.seq); }
  void recycle(const Event&) {}
  void* system_alloc(size_t cls) {
    ++sys->allocs;
    return std::malloc(cls);
  }
  void system_free(void* p) {
    ++sys->frees;
    std::free(p);
  }
  [[noreturn]] void out_of_memory(size_t, size_t, const MemoryStats&, int64_t) { std::abort(); }
  void warn_release_failure(const std::exception&) noexcept {}
};

constexpr int64_t kBatch = 128, kSize = 224, kClasses = 1000;
constexpr int kSteps = 200, kEpoch = 50;
constexpr int kWindow = 16;  // the loader's batches made ahead (threads x prefetch)

// The bytes copy_ahead packs for batch `b` of the whole recipe (random erasing 0.25, per-pixel values, one
// box): the boxes as the loader draws them, the layout as pack_model_input_draws makes it.
int64_t recipe_draws_bytes(int64_t b) {
  Batch batch;
  batch.pixels = empty({kBatch, 1, 1, 3}, DType::u8);  // only its count of images is read
  batch.erased.resize(size_t(kBatch));
  const RandomErasingConfig boxes_only{0.25, EraseMode::constant, 1};
  for (int64_t i = 0; i < kBatch; ++i) {
    CounterRng rng = sample_stream(7, RngDomain::erase, 0, b * kBatch + i);
    batch.erased[size_t(i)] = draw_erasing(boxes_only, kSize, kSize, rng);
    for (ErasePatch& p : batch.erased[size_t(i)]) {  // as the per-pixel mode fills them
      p.per_pixel = true;
      p.values.assign(size_t(p.box.h * p.box.w * 3), 0.0f);
    }
  }
  return model_input_bytes(batch) - batch.pixels.numel();
}

TEST(PinnedDraws, PoolStaysFlatAfterTheFirstEpochOfTheWholeRecipe) {
  std::vector<int64_t> draws(kSteps + 1);
  std::set<size_t> device_classes;
  for (int64_t b = 0; b <= kSteps; ++b) {
    draws[size_t(b)] = recipe_draws_bytes(b);
    device_classes.insert(round_to_size_class(size_t(draws[size_t(b)])));
  }
  const auto [lo, hi] = std::minmax_element(draws.begin(), draws.end());
  EXPECT_GT(*lo, 1'500'000);
  EXPECT_LT(*hi, 6'000'000);
  // By exact device classes, this many cudaHostAllocs at least: what the test guards against.
  EXPECT_GE(device_classes.size(), 30u);

  CountingSystem sys;
  cuda::BlockPool<CountingBackend> pool(CountingBackend{&sys}, /*home_streams=*/false, "pinned");
  const Stream compute{Device::cuda(0), reinterpret_cast<void*>(0x10)};
  const Stream copy{Device::cuda(0), reinterpret_cast<void*>(0x20)};
  const size_t pixels = size_t(kBatch * kSize * kSize * 3);
  std::deque<void*> made;  // the loader's pinned batches, made ahead, oldest first
  for (int b = 0; b < kWindow; ++b) made.push_back(pool.allocate(pixels, Stream{}));
  // copy_ahead packs at the process's capacity (grow_draws_capacity), which grows with the draws.
  size_t capacity = 0;
  int growths = 0;
  const auto pack = [&](int64_t bytes) {
    const size_t grown = grow_draws_capacity(capacity, size_t(bytes));
    EXPECT_GE(grown, size_t(bytes));
    growths += grown != capacity;
    capacity = grown;
    return pool.allocate(capacity, Stream{});
  };
  void* next_draws = pack(draws[0]);  // before the first step
  int64_t allocs_after_epoch = 0, reserved_after_epoch = 0, reserved_max = 0;
  for (int step = 0; step < kSteps; ++step) {
    void* batch_pixels = made.front();
    made.pop_front();
    void* batch_draws = next_draws;
    // model_input reads the draws on the compute stream; Tensor::to stages labels and soft targets.
    pool.record_stream(batch_draws, compute);
    for (size_t staged : {size_t(kBatch * 8), size_t(kBatch * kClasses * 4)}) {
      void* p = pool.allocate(staged, Stream{});
      pool.record_stream(p, compute);
      pool.release(p);
    }
    ++sys.queued[compute.handle];  // forward and backward
    // The next batch taken ahead: its pixels copied on the copy stream, its draws packed, and a worker
    // starts a batch in the slot it freed. The copy taken ahead in the step before is done by now (the step's
    // input waited for it); the one just queued may still run.
    sys.done[copy.handle] = sys.queued[copy.handle];
    pool.record_stream(made.front(), copy);
    ++sys.queued[copy.handle];
    next_draws = pack(draws[size_t(step + 1)]);
    made.push_back(pool.allocate(pixels, Stream{}));
    // The step's closing synchronize (the compute stream), then the step's batch goes: its pixels pending on
    // the copy queued after their own.
    sys.done[compute.handle] = sys.queued[compute.handle];
    pool.release(batch_draws);
    pool.release(batch_pixels);
    if (step + 1 == kEpoch) {
      allocs_after_epoch = sys.allocs;
      reserved_after_epoch = pool.stats().reserved_bytes;
    }
    if (step + 1 > kEpoch) reserved_max = std::max(reserved_max, pool.stats().reserved_bytes);
  }
  const MemoryStats s = pool.stats();
  EXPECT_EQ(s.num_system_allocs, sys.allocs);
  EXPECT_EQ(sys.allocs, allocs_after_epoch) << "host allocations after the first epoch";
  EXPECT_EQ(reserved_max, reserved_after_epoch);
  EXPECT_LE(growths, 3);
  // Held: the loader's window of pixels (and the one a worker starts before the step's batch goes), and a few
  // draws buffers.
  const int64_t pixel_blocks = int64_t(kWindow + 1) * int64_t(round_to_pinned_class(pixels));
  const int64_t besides = s.reserved_bytes - pixel_blocks;
  EXPECT_LE(besides, 6 * int64_t(capacity));
  std::printf(
      "draws %lld-%lld B (%zu device classes); capacity %.2f MiB after %d growths; pinned "
      "allocations %lld; reserved %.1f MiB, %.1f MiB besides the pixels\n",
      (long long)*lo, (long long)*hi, device_classes.size(), double(capacity) / (1 << 20), growths,
      (long long)sys.allocs, double(s.reserved_bytes) / (1 << 20), double(besides) / (1 << 20));
  for (void* p : made) pool.release(p);
  pool.release(next_draws);
  pool.empty_cache();
  EXPECT_EQ(sys.frees, sys.allocs);
}

// The same on a GPU: 200 batches of the loader with the whole recipe at 224 px (RandAugment, erasing,
// Mixup/CutMix), copied ahead and made into the model's input as the trainer does; the pinned allocator's
// system allocations (each a cudaHostAlloc) stop after the first epoch. Not yet run on a GPU.
TEST(PinnedDraws, CudaHostAllocsStopAfterTheFirstEpoch) {
  if (cuda_runtime::device_count() == 0) GTEST_SKIP() << "no GPU: pinned memory is CUDA's";
  const Device gpu = Device::cuda(0);
  LoaderOptions o = testing::loader_options(kBatch, kSize);
  o.seed = 3;
  o.threads = int(std::clamp(std::thread::hardware_concurrency(), 2u, 15u));
  o.endless = true;
  testing::with_recipe(o, 0.25, 10);
  o.pixels_only = true;
  o.pinned = true;
  Loader loader(open_dataset("synthetic:n=6400,classes=10,size=256", Split::train, {}), o);
  ASSERT_EQ(loader.steps_per_epoch(), kEpoch);
  loader.start_epoch(0);
  Allocator& pinned = pinned_host_allocator();
  std::optional<Batch> ahead = loader.next();
  copy_ahead(*ahead, gpu);
  int64_t allocs_after_epoch = 0, reserved_after_epoch = 0;
  std::set<int64_t> sizes;
  for (int step = 0; step < kSteps; ++step) {
    Batch b = std::move(*ahead);
    sizes.insert(b.draws.pinned.numel());
    Tensor images = model_input(b, gpu);
    Tensor targets = b.targets.to(gpu);  // staged through pinned memory
    ahead = loader.next();
    copy_ahead(*ahead, gpu);
    current_stream(gpu).synchronize();
    if (step + 1 == kEpoch) {
      allocs_after_epoch = pinned.stats().num_system_allocs;
      reserved_after_epoch = pinned.stats().reserved_bytes;
    }
  }
  EXPECT_GE(sizes.size(), 50u) << "the draws should change size from batch to batch";
  EXPECT_EQ(pinned.stats().num_system_allocs, allocs_after_epoch) << "cudaHostAlloc after the first epoch";
  EXPECT_EQ(pinned.stats().reserved_bytes, reserved_after_epoch);
  std::printf("pinned: %lld cudaHostAllocs, %.1f MiB reserved; %zu draws sizes\n",
              (long long)pinned.stats().num_system_allocs, double(pinned.stats().reserved_bytes) / (1 << 20),
              sizes.size());
}

}  // namespace
}  // namespace cz
