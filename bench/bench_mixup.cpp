// What Mixup/CutMix cost (docs/training.md, "Mixup and CutMix"): the mixing of one micro-batch (draw, pixels,
// targets) per mode, the loader's img/s on one thread with and without it, and the soft-target loss against
// the hard-label one, forward and backward, at ConvNeXt-atto's training shapes and at ImageNet's 1000
// classes.
#include <benchmark/benchmark.h>

#include "io/data/loader.h"
#include "io/data/sampler.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace cz {
namespace {

MixConfig recipe(MixMode mode, int64_t classes) {
  MixConfig c;  // ConvNeXt's: --mixup 0.8 --cutmix 1.0 --label-smoothing 0.1
  c.mixup_alpha = 0.8;
  c.cutmix_alpha = 1.0;
  c.mode = mode;
  c.label_smoothing = 0.1;
  c.num_classes = classes;
  return c;
}

// One micro-batch of 32 images of 64 px (args: mode): draw, mix the pixels in place, make the targets. Items:
// images.
void BM_MixBatch(benchmark::State& state) {
  const MixMode mode = MixMode(state.range(0));
  const int64_t n = 32, s = 64, classes = 10;
  Generator gen(1);
  Tensor images = randn({n, s, s, 3}, gen);
  const Tensor labels = randint(classes, {n}, gen);
  int64_t batch = 0;
  for (auto _ : state) {
    CounterRng rng = mix_stream(3, 0, batch++ * n);
    const MixParams p = draw_mix(recipe(mode, classes), n, s, s, rng);
    apply_mix(p, images);
    benchmark::DoNotOptimize(mix_targets(p, labels, classes, 0.1));
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetLabel(mix_mode_name(mode));
}
BENCHMARK(BM_MixBatch)->Arg(int(MixMode::batch))->Arg(int(MixMode::pair))->Arg(int(MixMode::elem));

// The loader on the calling thread (threads 0): synthetic 64 px images, random-resized-crop and flip, batches
// of 32, without (arg 0) and with (arg 1) ConvNeXt's Mixup/CutMix. Items: images, so items/s is img/s of one
// thread.
void BM_LoaderOneThread(benchmark::State& state) {
  LoaderOptions o;
  o.batch_size = 32;
  o.image_size = 64;
  o.augment = true;
  o.threads = 0;
  o.endless = true;  // across epochs, as training reads (Note [Running ahead])
  if (state.range(0)) o.mix = recipe(MixMode::batch, 10);
  Loader loader(open_dataset("synthetic:n=4096,size=64", Split::train, {}), o);
  for (auto _ : state) {
    std::optional<Batch> b = loader.next();
    benchmark::DoNotOptimize(b->images.raw_data());
  }
  state.SetItemsProcessed(state.iterations() * o.batch_size);
  state.SetLabel(state.range(0) ? "mixup 0.8 + cutmix 1.0" : "no mixing");
}
BENCHMARK(BM_LoaderOneThread)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Forward and backward of the loss (args: batch, classes; 0 hard labels with smoothing, 1 soft targets).
void BM_Loss(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1);
  const bool soft = state.range(2) != 0;
  Generator gen(2);
  const Tensor logits = randn({n, k}, gen), labels = randint(k, {n}, gen);
  const Tensor targets = full({n, k}, 1.0 / double(k));
  for (auto _ : state) {
    Tensor z = logits.detach().set_requires_grad(true);
    Tensor loss = soft ? soft_target_cross_entropy(z, targets) : cross_entropy(z, labels, 0.1);
    loss.backward();
    benchmark::DoNotOptimize(z.grad().raw_data());
  }
  state.SetLabel(soft ? "soft targets" : "labels, smoothing 0.1");
}
BENCHMARK(BM_Loss)->Args({32, 10, 0})->Args({32, 10, 1})->Args({128, 1000, 0})->Args({128, 1000, 1});

}  // namespace
}  // namespace cz

BENCHMARK_MAIN();
