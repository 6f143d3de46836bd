// Batches for training and evaluation: a deterministic sampler that splits each global batch across ranks,
// and worker threads that decode, crop/resize, augment and normalise ahead of the consumer.
//
// Note [Sampling]: epoch e's order is a permutation of the data set drawn from (seed, e) alone (file order
// with shuffle off). Global batch b holds positions [b*B, (b+1)*B) of that order, B = batch_size, and rank r
// of W takes the contiguous slice [r*B/W, (r+1)*B/W) of it, so W ranks with micro-batch m see exactly the
// examples one rank with micro-batch W*m sees, in the same places. Augmentation draws from (seed, epoch,
// position in the epoch): the same sample is augmented the same way whatever the world size or thread count.
// The order is timm's training transform's: crop and resize, flip, RandAugment (8-bit), normalise, random
// erasing; RandAugment and erasing draw from streams of their own per sample (sample_stream, sampler.h).
//
// Note [Running ahead]: the batches are a stream, epoch after epoch, from the position start_epoch gives
// (stream position p is global batch p % E of epoch p / E, E = steps_per_epoch()). Every batch is a pure
// function of its position (Note [Sampling]), so the workers need no word from the consumer at an epoch's
// end: with `endless` they go on into epoch e+1 while e's last batches are consumed, and the pipeline never
// drains (a drain costs 0.46-0.59 s at each epoch's end on a GPU). Each batch says its epoch and index;
// what a checkpoint records is the consumer's position (the batches it used), never the workers'. The workers
// make each batch in chunks of kChunkImages images, claimed in stream order, so all of them work on the batch
// in front and the consumer waits for one chunk's time, not one batch's; at most threads x prefetch batches
// are made or being made beyond those taken (the memory planner's window).
//
// Note [Resuming at another global batch]: a checkpoint records the position in its epoch's order that its
// batches reached (Batch::next_position), not a batch number, because a resume may have another global batch
// B' (other ranks, another micro-batch). The resumed epoch is then cut from that position: global batch b is
// positions [p + b*B', p + (b+1)*B'), split across the new ranks as any batch is, so every position of the
// epoch is read once over the two runs, in the order the seed fixed. Its last batch follows drop_last as an
// epoch's does: without it a partial batch, with it the last (n - p) mod B' positions are dropped (fewer than
// one batch, as an epoch drops n mod B). Augmentation is keyed by position (Note [Sampling]), so a resumed
// sample is augmented as it would have been; at the same B the batches are the original run's bit for bit.
// The epochs after the resumed one are whole.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "io/augment/image_transform.h"
#include "io/augment/mixup.h"
#include "io/augment/randaugment.h"
#include "io/augment/random_erasing.h"
#include "io/data/dataset.h"
#include "io/data/model_input.h"
#include "io/image/image.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace cz {

struct LoaderOptions {
  int64_t batch_size = 32;  // global: all ranks together
  int64_t image_size = 64;  // output images are image_size x image_size
  bool shuffle = true;
  bool augment = false;   // random-resized-crop (scale 0.08..1, ratio 3/4..4/3) + horizontal flip
  bool drop_last = true;  // false: the last, partial global batch is split across ranks as evenly as possible
  uint64_t seed = 0;
  int world = 1, rank = 0;
  int threads = 2;   // decoding workers (0: decode on the calling thread)
  int prefetch = 2;  // batches decoded ahead per worker: threads x prefetch in all
  // Note [Running ahead]: next() crosses epochs (training), the workers running ahead into the next; else
  // the stream ends with the epoch start_epoch began (evaluation: one pass).
  bool endless = false;
  // The resize filter of every image (the training crop's and evaluation's), and RandAugment's geometric ops.
  Interpolation interpolation = Interpolation::bilinear;
  // After the crop and flip, on the 8-bit image (Note [RandAugment], randaugment.h); off unless enabled.
  RandAugmentConfig rand_augment;
  // After normalisation (Note [Random erasing], random_erasing.h); off at probability 0.
  RandomErasingConfig erasing;
  // Mixup/CutMix of each rank's batch after normalisation (Note [Mixing within a micro-batch], mixup.h);
  // inactive by default.
  MixConfig mix;
  // Note [Normalising on the device] (model_input.h): with `pixels_only`, batches carry the 8-bit pixels and
  // the draws of erasing and mixing, and `images` is left for the consumer to make where the model runs
  // (model_input); without, the loader's threads make `images` on the CPU as well. `pinned`: the pixels in
  // page-locked memory (CUDA runs), so their copy to the device is asynchronous.
  bool pixels_only = false;
  bool pinned = false;
  // Note [Skipping bad samples]: an example whose image fails to decode (IoError) is replaced by the next
  // example of the data set that reads, for up to this many examples less the data set's own bad_samples(),
  // each reported on stderr; past that, or at 0, the error stops the run.
  int64_t skip_bad_samples = 0;
  // CPUs the worker threads are pinned to (empty: the process's mask). A CUDA rank keeps them off the core
  // its kernel-launching thread runs on (Note [CPU threads on a CUDA rank] in tensor/omp_wait_policy.h).
  std::vector<int> cpus;
};

struct Batch {
  Tensor pixels;  // (n, image_size, image_size, 3) u8, CPU: each image after the crop, resize, flip and
                  // RandAugment (Note [Normalising on the device], model_input.h)
  Tensor images;  // (n, image_size, image_size, 3) f32, CPU: model_input(*this) (normalised with ImageNet
                  // mean/std, erased, mixed); undefined with LoaderOptions::pixels_only
  std::vector<std::vector<ErasePatch>> erased;  // random erasing's draws per image (empty with erasing off)
  Tensor labels;                                // (n) i64, CPU: each image's own class
  Tensor targets;  // with mixing on: (n, num_classes) f32 soft targets, CPU; else undefined
  // Each image's index in the data set (host memory: not in the training allocator, whose peak the memory
  // planner predicts to the byte).
  std::vector<int64_t> sources;
  MixParams mix;  // with mixing on: how each image was mixed (partner, lam, box)
  // CUDA, copied ahead (copy_ahead in model_input.h, Note [Copying the next batch ahead]): `pixels` on the
  // device, and the event their copy's stream recorded after it.
  Tensor device_pixels;
  std::shared_ptr<Event> pixels_ready;
  PackedDraws draws;  // CUDA, packed ahead by copy_ahead: model_input's draws in pinned memory
  int64_t epoch = 0;
  // Global batch number within the epoch; in an epoch continued from position o (Loader::start_at),
  // floor(o / batch_size) plus the batches since.
  int64_t index = 0;
  int64_t first_sample = 0;   // position in the epoch of this rank's first sample
  int64_t next_position = 0;  // position in the epoch after this global batch (all ranks'): a checkpoint's
};

class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> data, LoaderOptions options);
  ~Loader();  // stops and joins the workers
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t steps_per_epoch() const;  // global batches per epoch
  // (Re)starts the stream at global batch `first_batch` of `epoch` (a resumed run: Note [Sampling] makes the
  // batches from there on the same as the original run's; first_batch = steps_per_epoch() is epoch+1's
  // first); batches made ahead are dropped. next() without it starts at epoch 0.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // (Re)starts the stream at position `position` (0..size) of `epoch`'s order (Note [Resuming at another
  // global batch]): that epoch's batches are positions [position + b*B, ...), as many as its remaining
  // examples make under drop_last; the epochs after it are whole. start_epoch(e, b) is start_at(e, b*B).
  void start_at(int64_t epoch, int64_t position);
  // This rank's share of the stream's next global batch (Batch::epoch and index say which); nullopt at the
  // epoch's end without `endless`. A worker's decode error is rethrown here, and again until start_epoch.
  std::optional<Batch> next();

  // Examples this loader replaced because they failed to decode (Note [Skipping bad samples]).
  int64_t skipped_samples() const;

  // The epoch's order as data set indices (Note [Sampling]); exposed for tests.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Images per chunk of a batch (Note [Running ahead]): a few milliseconds of work against one acquisition of
// the loader's lock; small enough that 16 workers share a batch of 128.
inline constexpr int64_t kChunkImages = 4;

}  // namespace cz
