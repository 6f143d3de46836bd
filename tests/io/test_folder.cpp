// folder: sources against each other and against what lies beside the images: eval classes matched to the
// training classes by name (Note [Class names]), hidden and other files skipped and reported, and the
// held-out split of --eval-split (Note [Held-out split]).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>

#include "common/error_of.h"
#include "io/data/dataset.h"
#include "io_testing.h"
#include "tensor/check.h"

namespace cz {
namespace {

using testing::TempDir;

// DIR/<class>/<i>.jpg, `per_class` small JPEGs per class.
void make_folder(const TempDir& root, const std::string& sub, const std::vector<std::string>& classes,
                 int per_class) {
  for (const std::string& c : classes) {
    std::filesystem::create_directories(root.path() / sub / c);
    for (int i = 0; i < per_class; ++i)
      testing::write_bytes(root.str(sub + "/" + c + "/" + std::to_string(i) + ".jpg"),
                           testing::encode_jpeg(testing::smooth_image(8, 8, uint32_t(i))));
  }
}

// The case: trained on cat, coffee, rocket; evaluated on a folder of cat and rocket only. By position
// rocket would be label 1 (coffee's); by name it is 2.
TEST(FolderClasses, EvalFolderWithFewerClassesTakesTheTrainingLabels) {
  TempDir dir;
  make_folder(dir, "train", {"cat", "coffee", "rocket"}, 2);
  make_folder(dir, "eval2", {"cat", "rocket"}, 3);
  const std::string train_spec = "folder:" + dir.str("train");
  auto train = open_dataset(train_spec, Split::train, {});
  EXPECT_EQ(train->class_names(), (std::vector<std::string>{"cat", "coffee", "rocket"}));
  auto eval = open_eval_dataset(train_spec, "folder:" + dir.str("eval2"), {}, train.get());
  ASSERT_EQ(eval->size(), 6);
  EXPECT_EQ(eval->num_classes(), 3);
  EXPECT_EQ(eval->class_names(), train->class_names());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(eval->label(i), 0) << i;  // cat
  for (int i = 3; i < 6; ++i) EXPECT_EQ(eval->label(i), 2) << i;  // rocket
  EXPECT_HAS(eval->describe(), "2 of the 3 training classes");
  Image img;
  eval->read(5, img);
  EXPECT_EQ(img.height, 8);
}

TEST(FolderClasses, EvalClassTheTrainingSetLacksIsAnError) {
  TempDir dir;
  make_folder(dir, "train", {"cat", "coffee", "rocket"}, 1);
  make_folder(dir, "eval", {"cat", "dog", "eel"}, 1);
  const std::string train_spec = "folder:" + dir.str("train");
  auto train = open_dataset(train_spec, Split::train, {});
  const std::string e =
      error_of([&] { open_eval_dataset(train_spec, "folder:" + dir.str("eval"), {}, train.get()); });
  EXPECT_HAS(e, "--eval-data 'folder:" + dir.str("eval") + "'");
  EXPECT_HAS(e, "classes 'dog', 'eel' are not among the 3 classes");
  EXPECT_HAS(e, "(cat, coffee, rocket)");
}

// The same classes: labels as they are (no relabelling layer).
TEST(FolderClasses, SameClassesKeepTheirLabels) {
  TempDir dir;
  make_folder(dir, "train", {"a", "b"}, 1);
  make_folder(dir, "eval", {"a", "b"}, 2);
  auto train = open_dataset("folder:" + dir.str("train"), Split::train, {});
  auto eval = open_eval_dataset("folder:x", "folder:" + dir.str("eval"), {}, train.get());
  EXPECT_EQ(eval->label(1), 0);
  EXPECT_EQ(eval->label(2), 1);
  EXPECT_EQ(eval->describe().find("labelled by name"), std::string::npos) << eval->describe();
}

// macOS copies leave `._x.jpg` (AppleDouble metadata, no JPEG) beside every x.jpg: skipped, as every
// dot-file, and counted; other formats, stray files and nested folders are reported, not silently dropped.
TEST(FolderClasses, HiddenFilesSkippedAndEverythingSkippedReported) {
  TempDir dir;
  make_folder(dir, "d", {"cat", "rocket"}, 2);
  testing::write_bytes(dir.str("d/cat/._0.jpg"), std::vector<uint8_t>(4096, 0x07));
  testing::write_bytes(dir.str("d/cat/.DS_Store"), {1, 2, 3});
  testing::write_bytes(dir.str("d/cat/x.webp"), {'R', 'I', 'F', 'F'});
  testing::write_bytes(dir.str("d/rocket/y.bmp"), {'B', 'M'});
  testing::write_bytes(dir.str("d/rocket/z.BMP"), {'B', 'M'});
  testing::write_bytes(dir.str("d/README.txt"), {'h', 'i'});
  std::filesystem::create_directories(dir.path() / "d" / "rocket" / "more");
  std::filesystem::create_directories(dir.path() / "d" / ".ipynb_checkpoints");
  auto data = open_dataset("folder:" + dir.str("d"), Split::train, {});
  ASSERT_EQ(data->size(), 4);
  Image img;
  for (int64_t i = 0; i < data->size(); ++i) data->read(i, img);  // no ._0.jpg among them
  const std::string d = data->describe();
  EXPECT_HAS(d, "4 images, 2 classes: cat, rocket");
  EXPECT_HAS(d, "skipped 8");
  EXPECT_HAS(d, "3 hidden (.ipynb_checkpoints, cat/.DS_Store, cat/._0.jpg)");
  EXPECT_HAS(d, "2 .bmp, not JPEG or PNG (rocket/y.bmp, rocket/z.BMP)");
  EXPECT_HAS(d, "1 .webp, not JPEG or PNG (cat/x.webp)");
  EXPECT_HAS(d, "1 outside the class folders (README.txt)");
  EXPECT_HAS(d, "1 nested folder, not read (rocket/more)");
}

TEST(FolderClasses, ClassFolderWithoutImagesSaysWhatItHolds) {
  TempDir dir;
  make_folder(dir, "d", {"cat"}, 1);
  std::filesystem::create_directories(dir.path() / "d" / "dog");
  testing::write_bytes(dir.str("d/dog/a.webp"), {'R'});
  testing::write_bytes(dir.str("d/dog/._a.jpg"), {0});
  const std::string e = error_of([&] { open_dataset("folder:" + dir.str("d"), Split::train, {}); });
  EXPECT_HAS(e, "class folder 'dog' has no .jpg, .jpeg or .png files");
  EXPECT_HAS(e, "1 .webp, not JPEG or PNG (dog/a.webp)");
  EXPECT_HAS(e, "1 hidden (dog/._a.jpg)");
}

// Note [Held-out split]: disjoint, complete, per class, a function of the seed alone, in file order.
TEST(HeldOutSplit, DeterministicDisjointAndPerClass) {
  TempDir dir;
  make_folder(dir, "d", {"a", "b", "c"}, 20);
  std::filesystem::create_directories(dir.path() / "d" / "d");  // a class of one image keeps it
  testing::write_bytes(dir.str("d/d/0.jpg"), testing::encode_jpeg(testing::smooth_image(8, 8, 1)));
  auto data = open_dataset("folder:" + dir.str("d"), Split::train, {});
  const HeldOutSplit s = hold_out(data, 0.1, 7, "--eval-split 0.1");
  ASSERT_EQ(s.eval->size(), 6);  // 2 of each 20, none of the single image
  ASSERT_EQ(s.train->size(), 55);
  EXPECT_EQ(s.train->num_classes(), 4);
  EXPECT_EQ(s.eval->num_classes(), 4);
  EXPECT_EQ(s.eval->class_names(), data->class_names());
  const std::vector<int64_t> held = held_out_indices(*data, 0.1, 7);
  EXPECT_TRUE(std::is_sorted(held.begin(), held.end()));
  std::vector<int> per_class(4, 0);
  for (int64_t i : held) ++per_class[size_t(data->label(i))];
  EXPECT_EQ(per_class, (std::vector<int>{2, 2, 2, 0}));
  // The two parts are the examples of `data`, each once: the labels and pixels agree with the indices.
  std::set<int64_t> seen(held.begin(), held.end());
  EXPECT_EQ(seen.size(), held.size());
  Image a, b;
  for (int64_t i = 0; i < s.eval->size(); ++i) {
    s.eval->read(i, a);
    data->read(held[size_t(i)], b);
    EXPECT_EQ(a.pixels, b.pixels);
    EXPECT_EQ(s.eval->label(i), data->label(held[size_t(i)]));
  }
  int64_t prev = -1;
  for (int64_t i = 0, t = 0; i < data->size(); ++i) {
    if (seen.count(i)) continue;
    EXPECT_EQ(s.train->label(t), data->label(i));
    EXPECT_GT(i, prev);
    prev = i;
    ++t;
  }
  // The same seed gives the same split (every rank, every resumed run); another seed another one.
  EXPECT_EQ(held_out_indices(*data, 0.1, 7), held);
  EXPECT_NE(held_out_indices(*data, 0.1, 8), held);
  EXPECT_HAS(s.train->describe(), "--eval-split 0.1");
  EXPECT_HAS(s.eval->describe(), "--eval-split 0.1");
}

TEST(HeldOutSplit, HoldingOutNothingIsAnError) {
  TempDir dir;
  make_folder(dir, "d", {"a", "b"}, 3);
  auto data = open_dataset("folder:" + dir.str("d"), Split::train, {});
  EXPECT_HAS(error_of([&] { hold_out(data, 0.01, 0, "--eval-split 0.01"); }),
             "--eval-split 0.01: holds out no example");
  EXPECT_HAS(error_of([&] { hold_out(data, 1.5, 0, "--eval-split 1.5"); }), "[0, 1)");
  // Large fractions leave every class one training example.
  EXPECT_EQ(hold_out(data, 0.99, 0, "--eval-split 0.99").train->size(), 2);
}

}  // namespace
}  // namespace cz
