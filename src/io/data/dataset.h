// Image classification data sets behind `--data`: synthetic (embedded, learnable), h5:FILE, cifar10:DIR,
// folder:DIR and wds:PATTERN (tar shards in WebDataset's layout). A Dataset hands out examples as 8-bit RGB
// images of their stored size plus an integer label; the Loader (loader.h) crops, resizes, augments,
// normalises and batches them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/image/image.h"

namespace cz {

enum class Split { train, eval };

struct DatasetOptions {
  // Pixel size a source that makes its own images uses (synthetic); stored images keep their own size.
  int64_t image_size = 64;
  // wds: samples that cannot be used (a member without its label, a label out of range, a truncated shard's
  // last member) that may be left out at open, each named in describe(), before it is an error
  // (`--skip-bad-samples`); the loader's budget for images that fail to decode is what is left.
  int64_t skip_bad_samples = 0;
  // wds: the folder for the shards' index files ("": beside the shards, else the user's cache folder).
  std::string index_dir;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t num_classes() const = 0;
  virtual int64_t label(int64_t index) const = 0;
  // Decodes example `index` into `out` (resized storage reused). Safe to call from several threads at once.
  // IoError naming the file (and the entry) when the stored bytes cannot be decoded.
  virtual void read(int64_t index, Image& out) const = 0;
  // What the loader reads: the part of example `index` that the crop `choose` picks (given the stored
  // height and width) and that is then resized to out_size x out_size, into `out`, and that crop in `out`'s
  // pixels into `box`. Resampling `box` of `out` gives the crop of the whole image: exactly (the same pixels)
  // or, where the decoder scaled the crop down by 2, 4 or 8, as the DCT-scaled decode of it (folder JPEGs,
  // Note [Decoding the crop] in jpeg_region.h). By default the whole image is read.
  using CropChooser = std::function<CropBox(int64_t height, int64_t width)>;
  virtual void read_crop(int64_t index, const CropChooser& choose, int64_t out_size, Image& out,
                         CropBox& box) const {
    (void)out_size;
    read(index, out);
    box = choose(out.height, out.width);
  }
  virtual std::string describe() const = 0;  // "cifar10:/data/cifar (train, 50000 images, 10 classes)"
  // Label i's name at [i], for sources that name their classes (folder: the class folders); empty where
  // classes are numbers only (synthetic, h5, cifar10). Note [Class names].
  virtual std::vector<std::string> class_names() const { return {}; }
  // Examples of the source left out at open as unusable, each named in describe() (wds: with
  // DatasetOptions::skip_bad_samples); they count against the same budget as the loader's skipped images.
  virtual int64_t bad_samples() const { return 0; }
};

// Opens `spec` ("synthetic[:k=v,...]", "h5:FILE", "cifar10:DIR", "folder:DIR", "wds:PATTERN"). ValueError for
// an unknown kind or option, IoError naming the path for a missing, truncated or malformed source.
std::shared_ptr<const Dataset> open_dataset(const std::string& spec, Split split,
                                            const DatasetOptions& options);

// Whether `spec`'s source has an evaluation split of its own (synthetic, cifar10's test_batch.bin).
bool has_eval_split(const std::string& spec);

// The evaluation set of a run: `eval_spec` when given, else the eval split of `train_spec`. Checks that its
// classes fit the training set's (`train` may be null); when both name their classes, the eval set's labels
// are the training set's labels of the same names (Note [Class names]), and an eval class the training set
// lacks is a ValueError naming it.
std::shared_ptr<const Dataset> open_eval_dataset(const std::string& train_spec, const std::string& eval_spec,
                                                 const DatasetOptions& options, const Dataset* train);

// Note [Held-out split]: `--eval-split F` takes round(F * n_c) of each class's n_c examples (at most n_c - 1,
// so no class leaves the training set) out of `data` as the eval set, and trains on the rest. Which ones is a
// Fisher-Yates draw per class from Philox keyed by (seed, "holdout") at the class's counter: a function of
// the seed and the labels alone, so every rank, thread and resumed run makes the same split, and the two
// parts never share an example. Both keep `data`'s order, class count and names. ValueError naming `what`
// ("--eval-split 0.05") when the fraction is outside [0, 1) or holds out nothing.
struct HeldOutSplit {
  std::shared_ptr<const Dataset> train, eval;
};
HeldOutSplit hold_out(std::shared_ptr<const Dataset> data, double fraction, uint64_t seed,
                      const std::string& what);
// The example indices of `data` that hold_out puts in the eval set, ascending (for tests and tools).
std::vector<int64_t> held_out_indices(const Dataset& data, double fraction, uint64_t seed);

// "cat, coffee, rocket" for a few names; the first `shown` and a count for many.
std::string join_names(const std::vector<std::string>& names, size_t shown = 8);

}  // namespace cz
