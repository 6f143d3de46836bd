// Image classification data sets behind `--data`: synthetic (embedded, learnable), h5:FILE, cifar10:DIR and
// folder:DIR. A Dataset hands out examples as 8-bit RGB images of their stored size plus an integer label;
// the Loader (loader.h) crops, resizes, augments, normalises and batches them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cz {

enum class Split { train, eval };

// An 8-bit RGB image, rows top to bottom, pixels interleaved: pixels[(y * width + x) * 3 + c].
struct Image {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> pixels;
};

struct DatasetOptions {
  // Pixel size a source that makes its own images uses (synthetic); stored images keep their own size.
  int64_t image_size = 64;
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
  virtual std::string describe() const = 0;  // "cifar10:/data/cifar (train, 50000 images, 10 classes)"
};

// Opens `spec` ("synthetic[:k=v,...]", "h5:FILE", "cifar10:DIR", "folder:DIR"). ValueError for an unknown
// kind or option, IoError naming the path for a missing, truncated or malformed source.
std::shared_ptr<const Dataset> open_dataset(const std::string& spec, Split split,
                                            const DatasetOptions& options);

// Whether `spec`'s source has an evaluation split of its own (synthetic, cifar10's test_batch.bin).
bool has_eval_split(const std::string& spec);

// The evaluation set of a run: `eval_spec` when given, else the eval split of `train_spec`. Checks that its
// classes fit the training set's (`train` may be null).
std::shared_ptr<const Dataset> open_eval_dataset(const std::string& train_spec, const std::string& eval_spec,
                                                 const DatasetOptions& options, const Dataset* train);

}  // namespace cz
