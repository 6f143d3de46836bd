// Note [Normalising on the device] (model_input.h). Compiled with -ffp-contract=off: each product and sum of
// model_input_element.h rounded on its own, as normalise_u8's and apply_mix's are.
#include "io/data/model_input.h"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "io/data/loader.h"
#include "tensor/check.h"
#if CZ_WITH_CUDA
#include "tensor/cuda/allocator.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#endif

namespace cz {

batch_input::Normalisation imagenet_normalisation() {
  batch_input::Normalisation n{};
  for (int c = 0; c < 3; ++c) {
    n.mul[c] = 1.0f / (255.0f * kImageNetStd[c]);
    n.add[c] = -kImageNetMean[c] / kImageNetStd[c];
  }
  return n;
}

ModelInputDraws model_input_draws(const Batch& batch) {
  const int64_t n = batch.pixels.defined() ? batch.pixels.size(0) : 0;
  ModelInputDraws d;
  d.images.resize(size_t(n));
  const bool mixed = !batch.mix.samples.empty();
  CZ_CHECK(!mixed || int64_t(batch.mix.samples.size()) == n,
           "model_input: the batch has {} images and {} mixing draws", n, batch.mix.samples.size());
  CZ_CHECK(batch.erased.empty() || int64_t(batch.erased.size()) == n,
           "model_input: the batch has {} images and {} erasing draws", n, batch.erased.size());
  for (int64_t i = 0; i < n; ++i) {
    batch_input::ImageParams& q = d.images[size_t(i)];
    q.partner = int32_t(i);
    if (!batch.erased.empty()) {
      q.erase_first = int32_t(d.rects.size());
      for (const ErasePatch& p : batch.erased[size_t(i)]) {
        d.rects.push_back({int32_t(p.box.top), int32_t(p.box.left), int32_t(p.box.h), int32_t(p.box.w),
                           d.num_values, p.per_pixel ? 1 : 0});
        d.num_values += int64_t(p.values.size());
      }
      q.erase_count = int32_t(d.rects.size()) - q.erase_first;
    }
    if (!mixed) continue;
    const SampleMix& s = batch.mix.samples[size_t(i)];
    CZ_CHECK(s.partner >= 0 && s.partner < n, "model_input: image {} is mixed with {} of {}", i, s.partner,
             n);
    q.partner = int32_t(s.partner);
    if (s.cutmix) {
      q.mix = batch_input::kCutMix;
      q.y0 = int32_t(s.box.y0), q.y1 = int32_t(s.box.y1), q.x0 = int32_t(s.box.x0), q.x1 = int32_t(s.box.x1);
    } else if (s.lam != 1.0) {  // lam 1 leaves the image as it was (apply_mix)
      q.mix = batch_input::kBlend;
      std::tie(q.l, q.m) = mix_weights(batch.mix.mode, s.lam);
    }
  }
  return d;
}

const uint8_t* PackedDraws::data() const {
  if (pinned.defined()) return pinned.numel() > 0 ? pinned.data<uint8_t>() : nullptr;
  return host.data();
}

int64_t model_input_bytes(const Batch& batch) {
  if (!batch.pixels.defined()) return 0;
  const ModelInputDraws d = model_input_draws(batch);
  return batch.pixels.numel() +
         int64_t(d.images.size() * sizeof(batch_input::ImageParams) +
                 d.rects.size() * sizeof(batch_input::EraseRect)) +
         d.num_values * int64_t(sizeof(float));
}

size_t grow_draws_capacity(size_t capacity, size_t bytes) {
  return bytes <= capacity ? capacity : round_to_pinned_class(bytes + bytes / 4);
}

PackedDraws pack_model_input_draws(const Batch& batch, bool pinned) {
  const ModelInputDraws d = model_input_draws(batch);
  const size_t b_images = d.images.size() * sizeof(batch_input::ImageParams);
  const size_t b_rects = d.rects.size() * sizeof(batch_input::EraseRect);
  const size_t total = b_images + b_rects + size_t(d.num_values) * sizeof(float);
  PackedDraws p;
  p.rects_at = int64_t(b_images), p.values_at = int64_t(b_images + b_rects);
  if (pinned) {
    // Note [Pinned blocks]: the process's capacity, the same for every batch (and every loader) until a
    // batch's draws outgrow it.
    static std::atomic<size_t> capacity{0};
    size_t c = capacity.load(std::memory_order_relaxed);
    size_t want = grow_draws_capacity(c, total);
    while (want != c && !capacity.compare_exchange_weak(c, want)) want = grow_draws_capacity(c, total);
    p.pinned = empty_pinned({int64_t(want)}, DType::u8).narrow(0, 0, int64_t(total));
  } else {
    p.host.resize(total);
  }
  uint8_t* base = const_cast<uint8_t*>(p.data());
  if (b_images) std::memcpy(base, d.images.data(), b_images);
  if (b_rects) std::memcpy(base + p.rects_at, d.rects.data(), b_rects);
  // The values straight from each patch: the largest part (a per-pixel box is up to a third of the image's
  // floats), copied once.
  uint8_t* v = base + p.values_at;
  for (const std::vector<ErasePatch>& patches : batch.erased)
    for (const ErasePatch& e : patches) {
      if (e.values.empty()) continue;
      std::memcpy(v, e.values.data(), e.values.size() * sizeof(float));
      v += e.values.size() * sizeof(float);
    }
  return p;
}

void copy_ahead(Batch& batch, const Device& device) {
  if (!device.is_cuda() || !batch.pixels.defined()) return;
#if CZ_WITH_CUDA
  static std::mutex mu;
  static std::map<int, Stream> streams;  // per device, for the process
  Stream copy_stream;
  {
    const std::lock_guard lock(mu);
    auto [it, added] = streams.try_emplace(device.index, Stream{device, nullptr});
    if (added) it->second.handle = cuda_runtime::stream_create(device.index);
    copy_stream = it->second;
  }
  const StreamGuard on_copy_stream(copy_stream);  // the device block is the copy stream's, and the copy on it
  if (batch.pixels.storage() && batch.pixels.storage()->allocator() == &pinned_host_allocator()) {
    // The loader's pinned batch, read in place; not handed out again before the copy has read it.
    batch.device_pixels = empty(batch.pixels.sizes(), DType::u8, device);
    cuda_runtime::memcpy_async(batch.device_pixels.raw_data(), batch.pixels.raw_data(),
                               size_t(batch.pixels.nbytes()), cuda_runtime::CopyKind::host_to_device,
                               copy_stream);
    cuda::record_stream(batch.pixels, copy_stream);
  } else {
    batch.device_pixels = batch.pixels.to(device);  // staged through pinned memory by Tensor::to
  }
  batch.pixels_ready = std::make_shared<Event>(device);
  batch.pixels_ready->record(copy_stream);
  // The draws too (Note [Copying the next batch ahead]). Packed at the step's start, random erasing's values
  // (2.7-4.3 MB a batch at 224 px, batch 128) held forward's first kernel back by 1.5-5.8 ms while the GPU
  // waited: on the H200 the whole recipe ran at 0.87x its step, and at 0.98x with this.
  batch.draws = pack_model_input_draws(batch, /*pinned=*/true);
#else
  throw DeviceError(fmt::format("copy_ahead: {} needs a CUDA build", device.str()));
#endif
}

Tensor model_input(const Batch& batch, const Device& device) {
  // A batch made without a loader (benches, tests) may carry its input ready-made.
  if (!batch.pixels.defined() && batch.images.defined()) return batch.images.to(device);
  CZ_CHECK(batch.pixels.defined() && batch.pixels.dtype() == DType::u8 && batch.pixels.dim() == 4 &&
               batch.pixels.size(3) == 3 && batch.pixels.is_contiguous() && batch.pixels.is_cpu(),
           "model_input: the batch's pixels must be a contiguous CPU u8 (n, H, W, 3) tensor, got {}",
           batch.pixels.defined() ? shape_str(batch.pixels.sizes()) : std::string("none"));
  const int64_t n = batch.pixels.size(0), h = batch.pixels.size(1), w = batch.pixels.size(2);
  batch_input::BatchView view;
  view.height = h, view.width = w, view.norm = imagenet_normalisation();
  Tensor out = empty({n, h, w, 3}, DType::f32, device);
  const auto read_draws = [&view](const PackedDraws& draws) {
    const uint8_t* base = draws.data();
    view.images = reinterpret_cast<const batch_input::ImageParams*>(base);
    view.rects = reinterpret_cast<const batch_input::EraseRect*>(base + draws.rects_at);
    view.values = reinterpret_cast<const float*>(base + draws.values_at);
  };
  if (device.is_cpu()) {
    // The same packed draws as the CUDA kernel reads (in ordinary memory here).
    const PackedDraws draws = pack_model_input_draws(batch, /*pinned=*/false);
    read_draws(draws);
    view.pixels = n > 0 ? batch.pixels.data<uint8_t>() : nullptr;
    // The CUDA kernel's threads, one after another (its element_at is this loop's).
    float* o = n > 0 ? out.data<float>() : nullptr;
    const int64_t total = out.numel();
    for (int64_t e = 0; e < total; ++e) o[e] = batch_input::element_at(view, e);
    return out;
  }
#if CZ_WITH_CUDA
  // The pixels are copied to the device (asynchronously from the loader's pinned batches), or were copied
  // ahead (Note [Copying the next batch ahead]); the draws, a few hundred bytes besides the erased boxes'
  // values, travel in one pinned buffer the kernel reads where it is (unified addressing).
  const Stream stream = current_stream(device);
  Tensor pixels;
  if (batch.device_pixels.defined()) {
    batch.pixels_ready->wait(stream);
    pixels = batch.device_pixels;
    cuda::record_stream(pixels, stream);
  } else {
    pixels = batch.pixels.to(device);
  }
  const PackedDraws draws =
      batch.draws.pinned.defined() ? batch.draws : pack_model_input_draws(batch, /*pinned=*/true);
  read_draws(draws);
  view.pixels = n > 0 ? pixels.data<uint8_t>() : nullptr;
  cuda::model_input(view, out, stream);
  // The pinned block goes back to the pool only once the stream has run the kernel.
  if (draws.pinned.numel() > 0) cuda::record_stream(draws.pinned, stream);
  return out;
#else
  throw DeviceError(fmt::format("model_input: {} needs a CUDA build", device.str()));
#endif
}

}  // namespace cz
