// The loader: Note [Sampling] (loader.h) for what each rank reads, and Note [Running ahead] for how the
// workers make the stream of batches: in chunks of images, all of them on the batch in front, across epochs.
#include "io/data/loader.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "io/augment/image_transform.h"
#include "io/data/model_input.h"
#include "io/data/sampler.h"
#include "tensor/parallel.h"

namespace cz {

namespace {
constexpr int64_t kMaxEpochs = int64_t(1) << 22;  // the crop's counter holds the epoch in 22 bits
}  // namespace

struct Loader::Impl {
  // A batch being made (chunks claimed and done) or made (ready), or the error that stopped it.
  struct Slot {
    Batch batch;
    std::shared_ptr<const std::vector<int64_t>> order;  // its epoch's
    int64_t chunks = 0, claimed = 0, done = 0;
    std::exception_ptr error;  // the first chunk's that failed
    bool ready = false;
  };
  // A worker's images, reused from one image to the next: no allocation per image once their sizes are met.
  struct Scratch {
    Image img, crop;
    ResampleScratch resize;
  };

  std::shared_ptr<const Dataset> data;
  LoaderOptions opt;
  int64_t steps = 0;

  bool started = false;
  // Stream positions count global batches from the start: the first `first_steps` are those of epoch
  // `first_epoch` from position `first_offset` of its order (Note [Resuming at another global batch]), then
  // whole epochs of `steps`.
  int64_t first_epoch = 0, first_offset = 0, first_steps = 0;
  int64_t end = 0;  // the stream position where next() returns nullopt
  std::vector<std::thread> workers;
  std::mutex mu;
  std::condition_variable work_cv;   // workers: a chunk to claim, or stop
  std::condition_variable ready_cv;  // consumer: a batch is ready
  bool stop = false;
  std::atomic<bool> stopping{false};                  // read between images, to abandon a batch quickly
  int64_t next_out = 0;                               // the position next() takes
  int64_t claim = 0;                                  // the position whose chunks are claimed next
  Slot* open = nullptr;                               // its slot, once opened (map nodes stay put)
  std::map<int64_t, Slot> slots;                      // opened and not yet taken
  std::shared_ptr<const std::vector<int64_t>> order;  // the latest opened epoch's
  int64_t order_epoch = -1;
  std::exception_ptr failed;  // sticky until the next start_epoch
  mutable std::mutex bad_mu;  // Note [Skipping bad samples]: the examples that failed to decode
  mutable std::set<int64_t> bad;

  // Reads example `index` (at position `pos` of `epoch`) as far as its crop needs, and crops, resizes, flips
  // and RandAugments it into `out` (size x size x 3 bytes).
  void transform_image(int64_t epoch, int64_t index, int64_t pos, Scratch& s, uint8_t* out) const;
  // transform_image of `index`, or of the examples after it while it fails to decode and the budget of
  // Note [Skipping bad samples] lasts; returns the example read.
  int64_t read_or_skip(int64_t epoch, int64_t index, int64_t pos, Scratch& s, uint8_t* out) const;
  struct Place {
    int64_t epoch, b, offset;  // global batch b of the epoch's batches from position `offset`
  };
  Place place(int64_t p) const;
  Slot open_slot(int64_t p);                                 // the batch at stream position p, allocated
  void make_chunk(Slot& slot, int64_t c, Scratch& s) const;  // its images [c, c+1) x kChunkImages
  void finish(Slot& slot) const;                             // the batch's draws across images, and `images`
  bool claimable() const { return open != nullptr || (claim < end && claim < next_out + window()); }
  int64_t window() const { return int64_t(opt.threads) * opt.prefetch; }
  void work();
  void stop_workers();
};

void Loader::Impl::transform_image(int64_t epoch, int64_t index, int64_t pos, Scratch& s,
                                   uint8_t* out) const {
  const int64_t size = opt.image_size;
  // The crop is drawn from the stored size; the source decodes only what it needs (Dataset::read_crop).
  const auto choose = [&](int64_t height, int64_t width) {
    if (!opt.augment) return CropBox{0, 0, height, width};
    // 64 blocks per (epoch, position): the crop needs at most 12.
    CounterRng rng(rng_key(opt.seed, RngDomain::augment), (uint64_t(epoch) << 36 | uint64_t(pos)) << 6);
    return random_resized_crop(height, width, rng);
  };
  CropBox box;
  data->read_crop(index, choose, size, s.img, box);
  resample_u8(s.img, box, size, opt.interpolation, s.crop, s.resize);  // Note [8-bit resize]
  if (opt.rand_augment.enabled) {
    CounterRng rng = sample_stream(opt.seed, RngDomain::randaugment, epoch, pos);
    rand_augment(opt.rand_augment, s.crop, opt.interpolation, rng);
  }
  std::memcpy(out, s.crop.pixels.data(), s.crop.pixels.size());
}

// Note [Skipping bad samples]: the replacement is the next example in the data set's own order, a function of
// the data alone, so every run of the same data (and a resumed one) reads the same examples in its place; the
// position's augmentation draws are the ones it would have had. The budget counts distinct examples (a bad
// file is met again every epoch, and said once); it is the loader's, so each rank counts what it reads.
int64_t Loader::Impl::read_or_skip(int64_t epoch, int64_t index, int64_t pos, Scratch& s,
                                   uint8_t* out) const {
  const int64_t budget = opt.skip_bad_samples - data->bad_samples();
  for (;;) {
    try {
      transform_image(epoch, index, pos, s, out);
      return index;
    } catch (const IoError& e) {
      if (opt.skip_bad_samples == 0) throw;
      std::unique_lock<std::mutex> lock(bad_mu);
      if (bad.insert(index).second) {
        const int64_t k = int64_t(bad.size());
        if (k > budget)
          throw IoError(
              fmt::format("{} (more bad samples than --skip-bad-samples {}: {} left out at open, {} "
                          "failed to decode on this rank)",
                          e.what(), opt.skip_bad_samples, data->bad_samples(), k));
        std::fprintf(stderr, "convnext_zero: rank %d: skipped bad sample %lld of at most %lld: %s\n",
                     opt.rank, static_cast<long long>(k + data->bad_samples()),
                     static_cast<long long>(opt.skip_bad_samples), e.what());
      }
      index = (index + 1) % data->size();
    }
  }
}

Loader::Impl::Place Loader::Impl::place(int64_t p) const {
  if (p < first_steps) return {first_epoch, p, first_offset};
  const int64_t q = p - first_steps;
  return {first_epoch + 1 + q / steps, q % steps, 0};
}

Loader::Impl::Slot Loader::Impl::open_slot(int64_t p) {
  const auto [epoch, b, offset] = place(p);
  if (epoch != order_epoch) {  // once an epoch: O(n), under the lock where workers call it
    order = std::make_shared<const std::vector<int64_t>>(
        epoch_permutation(data->size(), opt.seed, epoch, opt.shuffle));
    order_epoch = epoch;
  }
  const BatchSlice s = rank_slice(data->size(), opt.batch_size, b, opt.world, opt.rank, offset);
  const int64_t n = s.end - s.begin, size = opt.image_size;
  Slot slot;
  slot.order = order;
  slot.chunks = std::max<int64_t>((n + kChunkImages - 1) / kChunkImages, 1);
  Batch& batch = slot.batch;
  batch.pixels =
      opt.pinned ? empty_pinned({n, size, size, 3}, DType::u8) : empty({n, size, size, 3}, DType::u8);
  batch.labels = empty({n}, DType::i64);
  batch.sources.resize(size_t(n));
  if (opt.erasing.probability > 0) batch.erased.resize(size_t(n));
  batch.epoch = epoch;
  batch.index = offset / opt.batch_size + b;
  batch.first_sample = s.begin;
  batch.next_position = std::min(offset + (b + 1) * opt.batch_size, data->size());
  return slot;
}

void Loader::Impl::make_chunk(Slot& slot, int64_t c, Scratch& s) const {
  Batch& batch = slot.batch;
  const int64_t n = batch.labels.numel(), size = opt.image_size;
  uint8_t* pixels = n > 0 ? batch.pixels.data<uint8_t>() : nullptr;
  int64_t* labels = n > 0 ? batch.labels.data<int64_t>() : nullptr;
  for (int64_t i = c * kChunkImages; i < std::min(n, (c + 1) * kChunkImages); ++i) {
    if (stopping.load(std::memory_order_relaxed)) return;  // the batch will be discarded
    const int64_t pos = batch.first_sample + i;
    const int64_t index =
        read_or_skip(batch.epoch, (*slot.order)[size_t(pos)], pos, s, pixels + i * size * size * 3);
    if (opt.erasing.probability > 0) {  // applied after normalisation (model_input)
      CounterRng rng = sample_stream(opt.seed, RngDomain::erase, batch.epoch, pos);
      batch.erased[size_t(i)] = draw_erasing(opt.erasing, size, size, rng);
    }
    labels[i] = data->label(index);
    batch.sources[size_t(i)] = index;
  }
}

void Loader::Impl::finish(Slot& slot) const {
  Batch& batch = slot.batch;
  const int64_t n = batch.labels.numel(), size = opt.image_size;
  if (stopping.load(std::memory_order_relaxed)) return;
  if (opt.mix.active() && n > 0) {
    // Note [Mixing within a micro-batch]: keyed by the position of the batch's first sample.
    CounterRng rng = mix_stream(opt.seed, batch.epoch, batch.first_sample);
    batch.mix = draw_mix(opt.mix, n, size, size, rng);
    batch.targets = mix_targets(batch.mix, batch.labels, opt.mix.num_classes, opt.mix.label_smoothing);
  }
  if (!opt.pixels_only) batch.images = model_input(batch, Device::cpu());
}

// Note [Running ahead]: claim the next chunk in stream order (opening its batch when it is the first), make
// it without the lock, and the worker that completes a batch's last chunk finishes it and hands it over.
void Loader::Impl::work() {
  Scratch scratch;
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    work_cv.wait(lock, [&] { return stop || claimable(); });
    if (stop) return;
    if (open == nullptr) {
      try {
        open = &slots.emplace(claim, open_slot(claim)).first->second;
      } catch (...) {  // allocation: the batch is handed over as this error
        Slot& failed_slot = slots[claim++];
        failed_slot.error = std::current_exception();
        failed_slot.ready = true;
        ready_cv.notify_all();
        continue;
      }
    }
    Slot& slot = *open;
    const int64_t c = slot.claimed++;
    if (slot.claimed == slot.chunks) {
      open = nullptr;
      ++claim;
    }
    lock.unlock();
    std::exception_ptr error;
    try {
      make_chunk(slot, c, scratch);
    } catch (...) {
      error = std::current_exception();  // rethrown by next() on the consumer's thread
    }
    lock.lock();
    if (error && !slot.error) slot.error = error;
    if (++slot.done < slot.chunks) continue;
    if (!slot.error) {
      lock.unlock();
      try {
        finish(slot);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      slot.error = error;
    }
    slot.ready = true;
    ready_cv.notify_all();
  }
}

void Loader::Impl::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  stopping = true;
  work_cv.notify_all();
  for (std::thread& t : workers) t.join();
  workers.clear();
  slots.clear();
  open = nullptr;
  stop = false;
  stopping = false;
}

Loader::Loader(std::shared_ptr<const Dataset> data, LoaderOptions options) : impl_(std::make_unique<Impl>()) {
  CZ_CHECK(data != nullptr, "Loader: no data set");
  CZ_CHECK(options.batch_size > 0, "Loader: batch size must be positive, got {}", options.batch_size);
  CZ_CHECK(options.image_size > 0, "Loader: image size must be positive, got {}", options.image_size);
  CZ_CHECK(options.world > 0 && options.rank >= 0 && options.rank < options.world,
           "Loader: rank {} is not in a world of {}", options.rank, options.world);
  CZ_CHECK(options.threads >= 0, "Loader: threads must be >= 0, got {}", options.threads);
  CZ_CHECK(options.prefetch > 0, "Loader: prefetch must be positive, got {}", options.prefetch);
  if (options.mix.active()) {
    // Every rank's share of a full batch is batch / world images (the loader mixes training batches, which
    // drop the last partial one).
    CZ_CHECK(options.drop_last && options.batch_size % options.world == 0 &&
                 (options.batch_size / options.world) % 2 == 0,
             "Loader: Mixup/CutMix pairs image i with image n-1-i of each rank's batch, which must be even; "
             "got {} images over {} rank(s)",
             options.batch_size, options.world);
    CZ_CHECK(options.mix.num_classes > 0, "Loader: Mixup/CutMix needs the number of classes");
    check_mix_config(options.mix, options.image_size);
  }
  CZ_CHECK(
      options.erasing.probability >= 0 && options.erasing.probability <= 1 && options.erasing.max_count >= 1,
      "Loader: random erasing needs a probability in [0, 1] and at least one box, got {} and {}",
      options.erasing.probability, options.erasing.max_count);
  impl_->data = std::move(data);
  impl_->opt = options;
  impl_->steps = batches_per_epoch(impl_->data->size(), options.batch_size, options.drop_last);
}

Loader::~Loader() {
  impl_->stop_workers();
}

int64_t Loader::skipped_samples() const {
  std::lock_guard<std::mutex> lock(impl_->bad_mu);
  return int64_t(impl_->bad.size());
}

int64_t Loader::steps_per_epoch() const {
  return impl_->steps;
}

std::vector<int64_t> Loader::epoch_order(int64_t epoch) const {
  return epoch_permutation(impl_->data->size(), impl_->opt.seed, epoch, impl_->opt.shuffle);
}

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  Impl& m = *impl_;
  CZ_CHECK(first_batch >= 0 && first_batch <= m.steps, "Loader: first batch {} of an epoch of {} batches",
           first_batch, m.steps);
  // The last batch may be partial (without drop_last): past it is the epoch's end.
  start_at(epoch, std::min(first_batch * m.opt.batch_size, m.data->size()));
}

void Loader::start_at(int64_t epoch, int64_t position) {
  CZ_CHECK(epoch >= 0 && epoch < kMaxEpochs, "Loader: epoch {} out of range [0, 2^22)", epoch);
  Impl& m = *impl_;
  const int64_t n = m.data->size();
  CZ_CHECK(position >= 0 && position <= n, "Loader: position {} of an epoch of {} examples", position, n);
  m.stop_workers();
  m.started = true;
  m.first_epoch = epoch;
  m.first_offset = position;
  m.first_steps = batches_per_epoch(n - position, m.opt.batch_size, m.opt.drop_last);
  m.next_out = m.claim = 0;
  m.end = m.opt.endless ? m.first_steps + (kMaxEpochs - epoch - 1) * m.steps : m.first_steps;
  m.failed = nullptr;
  for (int t = 0; t < m.opt.threads; ++t)
    m.workers.emplace_back([&m] {
      if (!m.opt.cpus.empty()) pin_current_thread(m.opt.cpus);  // refused: the mask stays, as without
      m.work();
    });
}

std::optional<Batch> Loader::next() {
  Impl& m = *impl_;
  if (!m.started) start_epoch(0);
  if (m.failed) std::rethrow_exception(m.failed);
  if (m.next_out >= m.end) return std::nullopt;
  if (m.workers.empty()) {
    try {
      Impl::Slot slot = m.open_slot(m.next_out++);
      Impl::Scratch scratch;
      for (int64_t c = 0; c < slot.chunks; ++c) m.make_chunk(slot, c, scratch);
      m.finish(slot);
      return std::move(slot.batch);
    } catch (...) {
      m.failed = std::current_exception();  // sticky, as with workers
      throw;
    }
  }
  std::unique_lock<std::mutex> lock(m.mu);
  std::map<int64_t, Impl::Slot>::iterator it;
  m.ready_cv.wait(lock, [&] {
    it = m.slots.find(m.next_out);
    return it != m.slots.end() && it->second.ready;
  });
  Impl::Slot slot = std::move(it->second);
  m.slots.erase(it);
  ++m.next_out;
  lock.unlock();
  m.work_cv.notify_all();  // room in the window
  if (slot.error) {
    m.failed = slot.error;
    std::rethrow_exception(slot.error);
  }
  return std::move(slot.batch);
}

}  // namespace cz
