// The loader: Note [Sampling] (loader.h) for what each rank reads, and a pool of workers that each build
// whole batches ahead of the consumer, at most threads x prefetch batches beyond the one being consumed.
#include "io/loader.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "io/image_transform.h"
#include "io/model_input.h"
#include "io/sampler.h"
#include "tensor/parallel.h"

namespace cz {

struct Loader::Impl {
  // A batch or the error that stopped it.
  struct Result {
    Batch batch;
    std::exception_ptr error;
  };

  std::shared_ptr<const Dataset> data;
  LoaderOptions opt;
  int64_t steps = 0;

  int64_t epoch = -1;  // -1: no epoch started yet
  std::vector<int64_t> order;
  std::vector<std::thread> workers;
  std::mutex mu;
  std::condition_variable work_cv;   // workers: room in the window, or stop
  std::condition_variable ready_cv;  // consumer: the next batch is ready
  bool stop = false;
  std::atomic<bool> stopping{false};  // read between images, to abandon a batch quickly
  int64_t next_claim = 0, next_out = 0;
  std::map<int64_t, Result> ready;
  std::exception_ptr failed;  // sticky until the next start_epoch

  // Reads example `index` (at position `pos` of the epoch) as far as its crop needs, and crops, resizes,
  // flips and RandAugments it into `out` (size x size x 3 bytes); `img` and `crop` are scratch.
  void transform_image(int64_t index, int64_t pos, Image& img, Image& crop, uint8_t* out) const;
  Batch make_batch(int64_t b) const;
  void work();
  void stop_workers();
};

void Loader::Impl::transform_image(int64_t index, int64_t pos, Image& img, Image& crop, uint8_t* out) const {
  const int64_t size = opt.image_size;
  // The crop is drawn from the stored size; the source decodes only what it needs (Dataset::read_crop).
  const auto choose = [&](int64_t height, int64_t width) {
    if (!opt.augment) return CropBox{0, 0, height, width};
    // 64 blocks per (epoch, position): the crop needs at most 12.
    CounterRng rng(rng_key(opt.seed, RngDomain::augment), (uint64_t(epoch) << 36 | uint64_t(pos)) << 6);
    return random_resized_crop(height, width, rng);
  };
  CropBox box;
  data->read_crop(index, choose, size, img, box);
  resample_u8(img, box, size, opt.interpolation, crop);  // Note [8-bit resize]
  if (opt.rand_augment.enabled) {
    CounterRng rng = sample_stream(opt.seed, RngDomain::randaugment, epoch, pos);
    rand_augment(opt.rand_augment, crop, opt.interpolation, rng);
  }
  std::memcpy(out, crop.pixels.data(), crop.pixels.size());
}

Batch Loader::Impl::make_batch(int64_t b) const {
  const BatchSlice s = rank_slice(data->size(), opt.batch_size, b, opt.world, opt.rank);
  const int64_t n = s.end - s.begin, size = opt.image_size;
  Batch batch;
  batch.pixels =
      opt.pinned ? empty_pinned({n, size, size, 3}, DType::u8) : empty({n, size, size, 3}, DType::u8);
  batch.labels = empty({n}, DType::i64);
  batch.sources.resize(size_t(n));
  batch.epoch = epoch;
  batch.index = b;
  batch.first_sample = s.begin;
  uint8_t* pixels = n > 0 ? batch.pixels.data<uint8_t>() : nullptr;
  if (opt.erasing.probability > 0) batch.erased.resize(size_t(n));
  int64_t* labels = n > 0 ? batch.labels.data<int64_t>() : nullptr;
  Image img, crop;
  for (int64_t i = 0; i < n; ++i) {
    if (stopping.load(std::memory_order_relaxed)) break;  // the batch will be discarded
    const int64_t pos = s.begin + i, index = order[size_t(pos)];
    transform_image(index, pos, img, crop, pixels + i * size * size * 3);
    if (opt.erasing.probability > 0) {  // applied after normalisation (model_input)
      CounterRng rng = sample_stream(opt.seed, RngDomain::erase, epoch, pos);
      batch.erased[size_t(i)] = draw_erasing(opt.erasing, size, size, rng);
    }
    labels[i] = data->label(index);
    batch.sources[size_t(i)] = index;
  }
  if (opt.mix.active() && n > 0 && !stopping.load(std::memory_order_relaxed)) {
    // Note [Mixing within a micro-batch]: keyed by the position of the batch's first sample.
    CounterRng rng = mix_stream(opt.seed, epoch, s.begin);
    batch.mix = draw_mix(opt.mix, n, size, size, rng);
    batch.targets = mix_targets(batch.mix, batch.labels, opt.mix.num_classes, opt.mix.label_smoothing);
  }
  if (!opt.pixels_only && !stopping.load(std::memory_order_relaxed))
    batch.images = model_input(batch, Device::cpu());
  return batch;
}

void Loader::Impl::work() {
  const int64_t window = int64_t(opt.threads) * opt.prefetch;
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    work_cv.wait(lock, [&] { return stop || (next_claim < steps && next_claim < next_out + window); });
    if (stop) return;
    const int64_t b = next_claim++;
    lock.unlock();
    Result r;
    try {
      r.batch = make_batch(b);
    } catch (...) {
      r.error = std::current_exception();  // rethrown by next() on the consumer's thread
    }
    lock.lock();
    ready.emplace(b, std::move(r));
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
  ready.clear();
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

int64_t Loader::steps_per_epoch() const {
  return impl_->steps;
}

std::vector<int64_t> Loader::epoch_order(int64_t epoch) const {
  return epoch_permutation(impl_->data->size(), impl_->opt.seed, epoch, impl_->opt.shuffle);
}

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  CZ_CHECK(epoch >= 0 && epoch < (int64_t(1) << 22), "Loader: epoch {} out of range [0, 2^22)", epoch);
  Impl& m = *impl_;
  CZ_CHECK(first_batch >= 0 && first_batch <= m.steps, "Loader: first batch {} of an epoch of {} batches",
           first_batch, m.steps);
  m.stop_workers();
  m.epoch = epoch;
  m.order = epoch_order(epoch);
  m.next_claim = m.next_out = first_batch;
  m.failed = nullptr;
  for (int t = 0; t < m.opt.threads; ++t)
    m.workers.emplace_back([&m] {
      if (!m.opt.cpus.empty()) pin_current_thread(m.opt.cpus);  // refused: the mask stays, as without
      m.work();
    });
}

std::optional<Batch> Loader::next() {
  Impl& m = *impl_;
  if (m.epoch < 0) start_epoch(0);
  if (m.failed) std::rethrow_exception(m.failed);
  if (m.next_out >= m.steps) return std::nullopt;
  if (m.workers.empty()) {
    try {
      return m.make_batch(m.next_out++);
    } catch (...) {
      m.failed = std::current_exception();  // sticky, as with workers
      throw;
    }
  }
  std::unique_lock<std::mutex> lock(m.mu);
  m.ready_cv.wait(lock, [&] { return m.ready.count(m.next_out) > 0; });
  auto it = m.ready.find(m.next_out);
  Impl::Result r = std::move(it->second);
  m.ready.erase(it);
  ++m.next_out;
  lock.unlock();
  m.work_cv.notify_all();
  if (r.error) {
    m.failed = r.error;
    std::rethrow_exception(r.error);
  }
  return std::move(r.batch);
}

}  // namespace cz
