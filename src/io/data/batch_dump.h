// --dump-batches: the training batches exactly as the model receives them (after augmentation and mixing),
// every one to HDF5 for tests and scripts, or the first as a picture to look at.
//
// HDF5 (FILE.h5 or FILE.hdf5; at several ranks each rank writes its own batches to FILE.rankR.h5): one row
// per image, in the order the model saw them, appended as the run goes and made visible when the run ends
// (or fails with an error; a killed run leaves none):
//   images (rows, S, S, 3) f32    normalised (ImageNet mean and std, attributes `mean`, `std`), mixed
//   labels (rows) i64             the image's own class
//   sources (rows) i64            its index in the data set
//   positions (rows) i64          its position in the epoch's order (Note [Sampling])
//   epochs, steps, micro_steps (rows) i64   when the model saw it (steps from 1)
// and with Mixup/CutMix on (Note [Mixing within a micro-batch]):
//   targets (rows, K) f32         the soft targets the loss used
//   mix_sources (rows) i64        the data-set index of the image mixed in
//   lams (rows) f64               the weight of the image's own pixels and class
//   cutmix (rows) u8, boxes (rows, 4) i64   whether CutMix pasted the box [y0, y1) x [x0, x1) (else zeros)
// Root attributes: rank, world, image_size, num_classes, mixing (0/1), mix_mode, mixup, cutmix, mixup_prob,
// mixup_switch_prob, label_smoothing.
//
// PNG (FILE.png, rank 0): a grid of the first micro-batch's images, un-normalised, each with its target below
// it: the class, or with mixing the classes that carry weight and their weights ("3:0.62").
#pragma once

#include <memory>
#include <string>

#include "io/data/loader.h"

namespace cz {

namespace h5 {
class File;
}

class BatchDump {
 public:
  enum class Format { hdf5, png };
  // What FILE's extension asks for; ValueError naming `flag` for any other extension.
  static Format format_of(const std::string& path, const std::string& flag);
  // The file rank `rank` of `world` writes: the path itself at one rank, FILE.rankR.EXT at several (HDF5);
  // for PNG rank 0's path, and "" for the other ranks (they write nothing).
  static std::string rank_path(const std::string& path, int world, int rank);

  // `mix`: the loader's mixing (its attributes are recorded); num_classes: the targets' width.
  BatchDump(const std::string& path, int world, int rank, const MixConfig& mix, int64_t num_classes,
            int64_t image_size);
  ~BatchDump();  // makes what was written visible (a run that failed with an error keeps its batches)
  BatchDump(const BatchDump&) = delete;
  BatchDump& operator=(const BatchDump&) = delete;

  // One micro-batch the model received at optimizer step `step` (from 1), micro-step `micro_step`.
  void write(const Batch& b, int64_t step, int64_t micro_step);
  // Commits the HDF5 file (idempotent); IoError naming the file if that fails.
  void finish();

 private:
  void write_png(const Batch& b);

  Format format_;
  std::string path_;  // this rank's file; "" for none
  std::unique_ptr<h5::File> file_;
  bool png_written_ = false;
};

// The picture: images (n, S, S, 3) normalised f32; targets (n, K) f32 or undefined (then labels are drawn).
// Written to `path` through a temporary file beside it. Exposed for tests.
void write_batch_png(const std::string& path, const Tensor& images, const Tensor& labels,
                     const Tensor& targets);

}  // namespace cz
