// Each data source reads back what a test wrote: h5, CIFAR-10 binaries, folders of JPEG and PNG files, and
// the synthetic set's determinism and learnability.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <fmt/format.h>

#include <cmath>

#include "common/error_of.h"
#include "io/data/dataset.h"
#include "io/decode/image_codec.h"
#include "io_testing.h"
#include "tensor/check.h"

namespace cz {
namespace {

using testing::TempDir;

std::vector<Image> smooth_images(int n, int64_t h, int64_t w) {
  std::vector<Image> v;
  for (int i = 0; i < n; ++i) v.push_back(testing::smooth_image(h, w, uint32_t(100 + i)));
  return v;
}

TEST(H5Source, ReadsImagesAndLabels) {
  TempDir dir;
  const auto images = smooth_images(5, 7, 9);
  const std::vector<int64_t> labels = {3, 0, 2, 3, 1};
  testing::write_h5_images(dir.str("d.h5"), images, labels);
  auto data = open_dataset("h5:" + dir.str("d.h5"), Split::train, {});
  ASSERT_EQ(data->size(), 5);
  EXPECT_EQ(data->num_classes(), 4);
  EXPECT_FALSE(has_eval_split("h5:" + dir.str("d.h5")));
  Image img;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(data->label(i), labels[size_t(i)]);
    data->read(i, img);
    ASSERT_EQ(img.height, 7);
    ASSERT_EQ(img.width, 9);
    EXPECT_EQ(img.pixels, images[size_t(i)].pixels) << "image " << i;
  }
  EXPECT_NE(data->describe().find("5 images"), std::string::npos) << data->describe();
}

// The class count --num-classes defaults to (issue 41 item 7): the largest label + 1, or the file's own
// num_classes attribute when it has one (classes without an example); an attribute below the labels, or not
// one integer, is an error naming it.
TEST(H5Source, NumClassesAttribute) {
  TempDir dir;
  const auto images = smooth_images(3, 4, 4);
  const std::string path = dir.str("d.h5");
  auto with_attribute = [&](hid_t type, const void* value, hsize_t n) {
    testing::write_h5_images(path, images, {0, 2, 1});
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t a = H5Acreate2(f, "num_classes", type, space, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(a, type, value), 0);
    H5Aclose(a);
    H5Sclose(space);
    H5Fclose(f);
  };
  testing::write_h5_images(path, images, {0, 2, 1});
  EXPECT_EQ(open_dataset("h5:" + path, Split::train, {})->num_classes(), 3);
  const int64_t six = 6, two = 2;
  with_attribute(H5T_NATIVE_INT64, &six, 1);
  EXPECT_EQ(open_dataset("h5:" + path, Split::train, {})->num_classes(), 6);
  with_attribute(H5T_NATIVE_INT64, &two, 1);
  EXPECT_HAS(error_of<IoError>([&] { open_dataset("h5:" + path, Split::train, {}); }),
             "h5:" + path + ": attribute num_classes = 2, but dataset 'labels' holds label 2");
  const double half = 0.5;
  with_attribute(H5T_NATIVE_DOUBLE, &half, 1);
  EXPECT_HAS(error_of<IoError>([&] { open_dataset("h5:" + path, Split::train, {}); }),
             "attribute 'num_classes' must be one integer");
}

TEST(Cifar10Source, ReadsTrainBatchesAndTestBatch) {
  TempDir dir;
  const auto images = smooth_images(12, 32, 32);
  std::vector<uint8_t> labels;
  for (int i = 0; i < 12; ++i) labels.push_back(uint8_t((i * 7) % 10));
  // Two records per train batch, two in the test batch.
  for (int b = 0; b < 5; ++b)
    testing::write_bytes(dir.str(fmt::format("data_batch_{}.bin", b + 1)),
                         testing::cifar_records({images[size_t(2 * b)], images[size_t(2 * b + 1)]},
                                                {labels[size_t(2 * b)], labels[size_t(2 * b + 1)]}));
  testing::write_bytes(dir.str("test_batch.bin"),
                       testing::cifar_records({images[10], images[11]}, {labels[10], labels[11]}));
  const std::string spec = "cifar10:" + dir.str();
  EXPECT_TRUE(has_eval_split(spec));
  auto train = open_dataset(spec, Split::train, {});
  auto eval = open_dataset(spec, Split::eval, {});
  ASSERT_EQ(train->size(), 10);
  ASSERT_EQ(eval->size(), 2);
  EXPECT_EQ(train->num_classes(), 10);
  Image img;
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(train->label(i), labels[size_t(i)]);
    train->read(i, img);
    EXPECT_EQ(img.pixels, images[size_t(i)].pixels) << "train record " << i;
  }
  eval->read(1, img);
  EXPECT_EQ(img.pixels, images[11].pixels);
  EXPECT_EQ(eval->label(1), labels[11]);
  EXPECT_EQ(open_eval_dataset(spec, "", {}, train.get())->size(), 2);
}

TEST(FolderSource, DecodesJpegAndPngWithSortedClasses) {
  TempDir dir;
  const auto images = smooth_images(4, 24, 40);
  std::filesystem::create_directories(dir.path() / "b_cat");
  std::filesystem::create_directories(dir.path() / "a_dog");
  // Extension case does not matter; the order within a class is by file name.
  testing::write_bytes(dir.str("a_dog/1.JPG"), testing::encode_jpeg(images[0]));
  testing::write_bytes(dir.str("a_dog/2.png"), testing::encode_png(images[1]));
  testing::write_bytes(dir.str("b_cat/x.Jpeg"), testing::encode_jpeg(images[2]));
  testing::write_bytes(dir.str("b_cat/y.PNG"), testing::encode_png(images[3]));
  testing::write_bytes(dir.str("b_cat/notes.txt"), {'h', 'i'});
  auto data = open_dataset("folder:" + dir.str(), Split::train, {});
  ASSERT_EQ(data->size(), 4);
  EXPECT_EQ(data->num_classes(), 2);
  const bool lossless[4] = {false, true, false, true};
  Image img;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(data->label(i), i / 2);
    data->read(i, img);
    ASSERT_EQ(img.height, 24);
    ASSERT_EQ(img.width, 40);
    const testing::PixelDiff d = testing::pixel_diff(img, images[size_t(i)]);
    if (lossless[i]) {
      EXPECT_EQ(d.max, 0) << "png " << i;
    } else {
      EXPECT_LT(d.mean, 2.0) << "jpeg " << i;
      EXPECT_LE(d.max, 24) << "jpeg " << i;
    }
  }
}

TEST(Codec, GreyJpegBecomesRgb) {
  const Image src = testing::smooth_image(16, 16, 7);
  const auto jpeg = testing::encode_jpeg(src, 95, /*grey=*/true);
  Image out;
  decode_image(jpeg.data(), jpeg.size(), "grey.jpg", out);
  ASSERT_EQ(out.pixels.size(), src.pixels.size());
  for (size_t p = 0; p < out.pixels.size(); p += 3) {
    ASSERT_EQ(out.pixels[p], out.pixels[p + 1]);
    ASSERT_EQ(out.pixels[p], out.pixels[p + 2]);
  }
}

TEST(SyntheticSource, DeterministicAndSplitsDiffer) {
  auto a = open_dataset("synthetic:n=64,eval_n=16,classes=4,size=16,seed=3", Split::train, {});
  auto b = open_dataset("synthetic:n=64,eval_n=16,classes=4,size=16,seed=3", Split::train, {});
  auto c = open_dataset("synthetic:n=64,eval_n=16,classes=4,size=16,seed=4", Split::train, {});
  auto e = open_dataset("synthetic:n=64,eval_n=16,classes=4,size=16,seed=3", Split::eval, {});
  EXPECT_EQ(a->size(), 64);
  EXPECT_EQ(e->size(), 16);
  EXPECT_EQ(a->num_classes(), 4);
  Image x, y, z, w;
  for (int i = 0; i < 16; ++i) {
    a->read(i, x);
    b->read(i, y);
    c->read(i, z);
    e->read(i, w);
    ASSERT_EQ(x.height, 16);
    EXPECT_EQ(x.pixels, y.pixels) << "same seed, same index";
    EXPECT_NE(x.pixels, z.pixels) << "another seed";
    EXPECT_NE(x.pixels, w.pixels) << "the eval split holds other samples";
  }
  // The size defaults to DatasetOptions::image_size.
  DatasetOptions opt;
  opt.image_size = 24;
  open_dataset("synthetic", Split::train, opt)->read(0, x);
  EXPECT_EQ(x.height, 24);
}

// A nearest-class-mean classifier on raw pixels, fitted on train and scored on eval, beats chance by far:
// the classes are learnable, while the jitter keeps them from being trivially separable.
TEST(SyntheticSource, ClassesAreDistinguishable) {
  const std::string spec = "synthetic:n=600,eval_n=300,classes=10,size=16";
  auto train = open_dataset(spec, Split::train, {});
  auto eval = open_dataset(spec, Split::eval, {});
  const size_t dim = 16 * 16 * 3;
  std::vector<std::vector<double>> mean(10, std::vector<double>(dim, 0.0));
  std::vector<int> count(10, 0);
  Image img;
  for (int64_t i = 0; i < train->size(); ++i) {
    train->read(i, img);
    const int64_t l = train->label(i);
    for (size_t k = 0; k < dim; ++k) mean[size_t(l)][k] += img.pixels[k];
    ++count[size_t(l)];
  }
  for (int c = 0; c < 10; ++c)
    for (double& v : mean[size_t(c)]) v /= count[size_t(c)];
  int correct = 0;
  for (int64_t i = 0; i < eval->size(); ++i) {
    eval->read(i, img);
    int best = 0;
    double best_d = INFINITY;
    for (int c = 0; c < 10; ++c) {
      double d = 0;
      for (size_t k = 0; k < dim; ++k) d += std::pow(img.pixels[k] - mean[size_t(c)][k], 2);
      if (d < best_d) best_d = d, best = c;
    }
    correct += best == eval->label(i);
  }
  const double acc = double(correct) / double(eval->size());
  std::printf("nearest-class-mean accuracy on synthetic eval: %.3f (chance 0.1)\n", acc);
  EXPECT_GT(acc, 0.3);
}

}  // namespace
}  // namespace cz
