// Every bad input gives a typed error whose message names the file, dataset key or flag at fault.
#include <gtest/gtest.h>

#include <functional>

#include "io/data/dataset.h"
#include "io/decode/image_codec.h"
#include "io_testing.h"
#include "tensor/check.h"

namespace cz {
namespace {

using testing::TempDir;

template <class E>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL() << "no error; expected one mentioning " << parts[0];
  } catch (const E& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

void open(const std::string& spec) {
  open_dataset(spec, Split::train, {});
}

TEST(DataErrors, UnknownKindAndMissingPath) {
  expect_error<ValueError>([] { open("imagenet:/data"); }, {"--data", "imagenet"});
  expect_error<ValueError>([] { open("h5:"); }, {"--data", "h5:PATH"});
  expect_error<IoError>([] { open("h5:/nonexistent/x.h5"); }, {"/nonexistent/x.h5", "no such file"});
  expect_error<IoError>([] { open("cifar10:/nonexistent/c"); }, {"/nonexistent/c"});
  expect_error<IoError>([] { open("folder:/nonexistent/f"); }, {"/nonexistent/f"});
}

TEST(DataErrors, BadSyntheticOptions) {
  expect_error<ValueError>([] { open("synthetic:n=10,colour=red"); }, {"--data", "colour"});
  expect_error<ValueError>([] { open("synthetic:n=ten"); }, {"n=ten"});
  expect_error<ValueError>([] { open("synthetic:classes=1"); }, {"classes=1"});
  expect_error<ValueError>([] { open("synthetic:size=4"); }, {"size=4"});
  expect_error<ValueError>([] { open("synthetic:n"); }, {"'n'", "key=value"});
  expect_error<ValueError>([] { open_eval_dataset("synthetic", "synthetic:m=1", {}, nullptr); },
                           {"--eval-data 'synthetic:m=1'", "'m'"});
}

TEST(DataErrors, EvalSplitAndClasses) {
  expect_error<ValueError>([] { open_eval_dataset("h5:/x.h5", "", {}, nullptr); },
                           {"h5:/x.h5", "--eval-data"});
  auto train = open_dataset("synthetic:classes=3,n=8", Split::train, {});
  expect_error<ValueError>(
      [&] { open_eval_dataset("synthetic:classes=3", "synthetic:classes=5", {}, train.get()); },
      {"--eval-data", "synthetic:classes=5", "5 classes"});
}

TEST(DataErrors, TruncatedCifarAndBadLabel) {
  TempDir dir;
  const auto img = testing::smooth_image(32, 32, 1);
  auto rec = testing::cifar_records({img, img}, {1, 2});
  testing::write_bytes(dir.str("test_batch.bin"), {rec.begin(), rec.end() - 100});
  expect_error<IoError>([&] { open_dataset("cifar10:" + dir.str(), Split::eval, {}); },
                        {"test_batch.bin", "6046", "3073"});
  expect_error<IoError>([&] { open("cifar10:" + dir.str()); }, {"data_batch_1.bin"});
  rec[3073] = 10;
  testing::write_bytes(dir.str("test_batch.bin"), rec);
  expect_error<IoError>([&] { open_dataset("cifar10:" + dir.str(), Split::eval, {}); },
                        {"test_batch.bin", "record 1", "label 10"});
}

// An h5 file with the given images/labels datasets (either may be left out).
void write_h5(const std::string& path, bool images_float, bool with_labels, std::vector<int64_t> labels,
              std::vector<hsize_t> image_dims = {3, 4, 4, 3}) {
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t count = 1;
  for (hsize_t d : image_dims) count *= d;
  std::vector<float> fpx(count, 0.5f);
  std::vector<uint8_t> upx(count, 7);
  if (images_float)
    testing::write_h5_dataset(f, "images", H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, image_dims, fpx.data());
  else
    testing::write_h5_dataset(f, "images", H5T_NATIVE_UINT8, H5T_STD_U8LE, image_dims, upx.data());
  if (with_labels)
    testing::write_h5_dataset(f, "labels", H5T_NATIVE_INT64, H5T_STD_I32LE, {labels.size()}, labels.data());
  H5Fclose(f);
}

TEST(DataErrors, BadH5Files) {
  TempDir dir;
  const std::string p = dir.str("bad.h5");
  write_h5(p, false, false, {});
  expect_error<IoError>([&] { open("h5:" + p); }, {p, "'labels'", "missing"});
  write_h5(p, true, true, {0, 1, 2});
  expect_error<IoError>([&] { open("h5:" + p); }, {p, "'images'", "uint8", "float32"});
  write_h5(p, false, true, {0, -1, 2});
  expect_error<IoError>([&] { open("h5:" + p); }, {p, "'labels'[1] = -1", "out of range"});
  write_h5(p, false, true, {0, 1});
  expect_error<IoError>([&] { open("h5:" + p); }, {p, "'labels'", "(2)", "(3)"});
  write_h5(p, false, true, {0, 1, 2}, {3, 4, 4});
  expect_error<IoError>([&] { open("h5:" + p); }, {p, "'images'", "(N, H, W, 3)", "(3, 4, 4)"});
  testing::write_bytes(p, {'n', 'o', 't', ' ', 'h', 'd', 'f'});
  expect_error<IoError>([&] { open("h5:" + p); }, {p, "not a readable HDF5 file"});
}

TEST(DataErrors, GarbageAndTruncatedImages) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "cls");
  const auto jpeg = testing::encode_jpeg(testing::smooth_image(64, 64, 2));
  testing::write_bytes(dir.str("cls/a.jpg"), {0xFF, 0xD8, 0xFF, 0x00, 0x12, 0x34, 0x56});
  testing::write_bytes(dir.str("cls/b.jpg"), {jpeg.begin(), jpeg.begin() + long(jpeg.size() * 3 / 4)});
  testing::write_bytes(dir.str("cls/c.png"), {'g', 'a', 'r', 'b', 'a', 'g', 'e'});
  const auto png = testing::encode_png(testing::smooth_image(16, 16, 3));
  testing::write_bytes(dir.str("cls/d.png"), {png.begin(), png.begin() + long(png.size() - 30)});
  auto data = open_dataset("folder:" + dir.str(), Split::train, {});
  Image img;
  expect_error<IoError>([&] { data->read(0, img); }, {"a.jpg", "JPEG"});
  expect_error<IoError>([&] { data->read(1, img); }, {"b.jpg", "corrupt JPEG"});
  expect_error<IoError>([&] { data->read(2, img); }, {"c.png", "neither a JPEG nor a PNG"});
  expect_error<IoError>([&] { data->read(3, img); }, {"d.png", "PNG"});
}

TEST(DataErrors, EmptyFolders) {
  TempDir dir;
  expect_error<IoError>([&] { open("folder:" + dir.str()); }, {dir.str(), "no class sub-folders"});
  std::filesystem::create_directories(dir.path() / "only_text");
  testing::write_bytes(dir.str("only_text/readme.txt"), {'x'});
  expect_error<IoError>([&] { open("folder:" + dir.str()); }, {"only_text", "no .jpg"});
}

// Each saved fuzzer finding, fed to the reader it was found with (by file-name prefix), is rejected with an
// IoError naming the file, or read; never a crash.
TEST(FuzzRegressions, SavedInputsAreRejectedCleanly) {
  int replayed = 0;
  for (const auto& e : std::filesystem::directory_iterator(CZ_FUZZ_REGRESSIONS)) {
    const std::string name = e.path().filename().string(), path = e.path().string();
    try {
      if (name.rfind("h5_", 0) == 0) {
        open("h5:" + path);
      } else if (name.rfind("cifar_", 0) == 0) {
        TempDir dir;
        std::filesystem::copy_file(path, dir.path() / "test_batch.bin");
        open_dataset("cifar10:" + dir.str(), Split::eval, {});
      } else if (name.rfind("image_", 0) == 0) {
        const auto bytes = read_file_bytes(path);
        Image img;
        decode_image(bytes.data(), bytes.size(), path, img);
      } else {
        continue;
      }
    } catch (const IoError& err) {
      EXPECT_NE(std::string(err.what()).find(name), std::string::npos) << err.what();
    }
    ++replayed;
  }
  EXPECT_GT(replayed, 0);
}

}  // namespace
}  // namespace cz
