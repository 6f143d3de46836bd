// Helpers for the io tests: a scratch directory, and writers for the formats the data sources read (HDF5
// through the C API, CIFAR-10 binary records, JPEG through TurboJPEG, PNG through libpng).
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/augment/randaugment.h"
#include "io/data/dataset.h"
#include "io/data/loader.h"
#include "tensor/tensor.h"

namespace cz::testing {

// Same shape, dtype and bytes (an undefined tensor equals only another undefined one).
inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

// Example `index` of the loader tests' made-up data sets: a 6x5 image whose pixels encode `index`.
inline void index_image(int64_t index, Image& out) {
  out.height = 6;
  out.width = 5;
  out.pixels.resize(6 * 5 * 3);
  for (size_t p = 0; p < out.pixels.size(); ++p)
    out.pixels[p] = uint8_t((index * 37 + int64_t(p) * 11) % 256);
}

// Loader options for batches of `batch` images of image x image pixels, the rest at their defaults.
inline LoaderOptions loader_options(int64_t batch, int64_t image) {
  LoaderOptions o;
  o.batch_size = batch;
  o.image_size = image;
  return o;
}

// The same, the examples in order (no shuffle).
inline LoaderOptions in_order(int64_t batch, int64_t image) {
  LoaderOptions o = loader_options(batch, image);
  o.shuffle = false;
  return o;
}

// The ConvNeXt recipe's augmentation on `o`: crop and flip, RandAugment rand-m9-mstd0.5-inc1, pixel erasing
// with probability `erase_p`, Mixup 0.8 and CutMix 1.0 over `classes` classes.
inline void with_recipe(LoaderOptions& o, double erase_p, int64_t classes) {
  o.augment = true;
  o.rand_augment = parse_rand_augment("rand-m9-mstd0.5-inc1");
  o.erasing = {erase_p, EraseMode::pixel, 1};
  o.mix.mixup_alpha = 0.8;
  o.mix.cutmix_alpha = 1.0;
  o.mix.num_classes = classes;
}

// The loader's next batch holds a corrupt example: next() throws an IoError naming `where`, and the call
// after it throws again (`stays` says until what, for the failure message). Fatal when nothing is thrown:
// call it under ASSERT_NO_FATAL_FAILURE.
inline void expect_batch_error(Loader& loader, const std::string& where, const std::string& stays) {
  try {
    loader.next();
    FAIL() << "the batch holds a corrupt example (" << where << ")";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
  }
  EXPECT_THROW(loader.next(), IoError) << "the error stays until " << stays;
}

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& child = "") const { return (path_ / child).string(); }

 private:
  std::filesystem::path path_;
};

// A smooth random-looking RGB image (gradients plus a few waves): compresses well, so JPEG stays close.
Image smooth_image(int64_t height, int64_t width, uint32_t seed);

// Writes `dims`-shaped `data` (of `mem_type`) as dataset `name`, stored as `file_type`, into an open file.
void write_h5_dataset(hid_t file, const std::string& name, hid_t mem_type, hid_t file_type,
                      const std::vector<hsize_t>& dims, const void* data);
// An h5 data set file: images uint8 (N, H, W, 3) from `images`, labels int64 (N).
void write_h5_images(const std::string& path, const std::vector<Image>& images,
                     const std::vector<int64_t>& labels);

// CIFAR-10 records (label byte + R, G, B planes) of 32x32 images.
std::vector<uint8_t> cifar_records(const std::vector<Image>& images, const std::vector<uint8_t>& labels);
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

// `grey`: a one-channel (luminance) JPEG.
std::vector<uint8_t> encode_jpeg(const Image& img, int quality = 95, bool grey = false);
std::vector<uint8_t> encode_png(const Image& img);

// Mean and largest absolute difference between two images' pixels (same size expected).
struct PixelDiff {
  double mean = 0;
  int max = 0;
};
PixelDiff pixel_diff(const Image& a, const Image& b);

}  // namespace cz::testing
