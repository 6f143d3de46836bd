// The model's input made from a batch of 8-bit pixels where the model runs.
//
// Note [Normalising on the device]: the loader hands over each image as it stands after the crop, resize,
// flip and RandAugment, 8-bit HWC (Batch::pixels: 3 bytes a pixel where normalised floats take 12), with the
// draws of what timm does after normalisation: random erasing's boxes and values (Note [Random erasing]) and
// the micro-batch's Mixup/CutMix (Note [Mixing within a micro-batch]). model_input() makes the f32 (n, H, W,
// 3) images on the model's device, every element by batch_input::element (model_input_element.h): the
// normalisation's multiply and add, the erase box's value where one covers it, the mix with the partner's
// erased pixels. On the CPU that loop fills the first op's input directly; on CUDA the 8-bit pixels are
// copied to the device (from the loader's pinned batches: LoaderOptions::pinned) and one kernel
// (src/tensor/cuda/model_input.cu) writes the device tensor, reading the draws from one pinned buffer in
// place (unified addressing): what crosses PCIe is the pixels and the draws, about a quarter of the f32
// batch (model_input_bytes). Both run the same arithmetic
// (each product and sum rounded, no multiply-adds), so the values equal the loader's former f32 batch: the
// 8-bit path's normalise_u8, random_erase and apply_mix, bit for bit (ModelInput.* tests).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/cuda/model_input_element.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace cz {

struct Batch;

// The per-image parameters and the erase boxes of a batch, flat (model_input_element.h); each box's values
// start at its EraseRect's offset into the batch's values, num_values in all.
struct ModelInputDraws {
  std::vector<batch_input::ImageParams> images;
  std::vector<batch_input::EraseRect> rects;
  int64_t num_values = 0;
};
ModelInputDraws model_input_draws(const Batch& batch);

// The draws in one byte buffer, as model_input reads them: the ImageParams, the EraseRects from `rects_at`,
// the erase values (f32) from `values_at`. `pinned`: in pinned host memory, which the CUDA kernel reads in
// place (copy_ahead packs them into the batch, Batch::draws, off the step's critical path); else in ordinary
// memory outside the training allocator, whose peak the memory planner predicts to the byte.
struct PackedDraws {
  Tensor pinned;
  std::vector<uint8_t> host;
  int64_t rects_at = 0, values_at = 0;
  const uint8_t* data() const;
};
PackedDraws pack_model_input_draws(const Batch& batch, bool pinned);

// Note [Pinned blocks] (tensor/cuda/block_pool.h): the packed draws change size with every batch (random
// erasing's values: 2-5 MB a batch of the whole recipe at 224 px, batch 128), so their pinned buffer is
// asked for at a capacity that only grows: `capacity` while the draws fit, else the pinned class of a quarter
// more than them. The pool then hands back blocks of one class batch after batch, and the capacity grows a
// few times in a run, in the first batches. pack_model_input_draws keeps the process's capacity.
size_t grow_draws_capacity(size_t capacity, size_t bytes);

// (n, H, W, 3) f32 on `device`: batch.pixels normalised, erased and mixed (Note [Normalising on the device]).
// A batch without pixels but with `images` (made without a loader: benches, tests) gives those, on `device`.
Tensor model_input(const Batch& batch, const Device& device);

// Note [Copying the next batch ahead]: on CUDA the trainer takes the next step's first batch from the loader
// once the current step's backward is queued, and copies its pixels to the device on a stream of its own
// (`copy_stream`), so that the copy runs while the GPU still works on the current step; the next step's
// model_input makes the compute stream wait for the copy's event instead of copying. The copy stream is one
// per device for the process (created at first use, kept to the end: the caching allocator's blocks belong
// to it). Only batches of the current epoch are taken ahead (the loader's epoch end is kept for the next
// step), and the checkpoint's position counts the batches used, not those taken ahead. The draws are packed
// into pinned memory here too (Batch::draws): random erasing's values are up to a few MB a batch. The pinned
// pixels and the device copy are marked used on the streams that read them (record_stream), so neither is
// reused before the copy and the kernel have run. On the CPU it does nothing.
void copy_ahead(Batch& batch, const Device& device);

// Bytes model_input moves from host to a device for `batch`: its pixels and draws.
int64_t model_input_bytes(const Batch& batch);

// ImageNet's normalisation as model_input applies it.
batch_input::Normalisation imagenet_normalisation();

}  // namespace cz
