// wds: tar shards (Note [Sharded tar data], io/data/dataset_wds.cpp): the tar reader and its index files,
// shard patterns, samples and labels against the same images as a folder, equal shares over uneven shards,
// and every bad input named or, with a budget, left out.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "common/error_of.h"
#include "io/data/dataset.h"
#include "io/data/loader.h"
#include "io/data/tar_index.h"
#include "io/decode/image_codec.h"
#include "io_testing.h"
#include "tensor/check.h"

namespace cz {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

// A tar written by hand: ustar headers, GNU 'L' long names and pax 'x' paths, as tar and Python write them.
class TarWriter {
 public:
  void file(const std::string& name, const std::string& data, char type = '0') {
    std::string short_name = name;
    if (name.size() > 100 && long_names_ == 'L') {
      header("././@LongLink", name.size() + 1, 'L');
      pad_data(name + '\0');
      short_name = name.substr(0, 100);
    } else if (name.size() > 100) {
      const std::string rec = "path=" + name + "\n";
      std::string len = std::to_string(rec.size() + 3);
      std::string record = len + " " + rec;
      if (record.size() != std::stoul(len)) record = std::to_string(record.size()) + " " + rec;
      header("PaxHeader", record.size(), 'x');
      pad_data(record);
      short_name = name.substr(0, 100);
    }
    header(short_name, data.size(), type);
    pad_data(data);
  }
  void dir(const std::string& name) { header(name, 0, '5'); }
  void use_pax() { long_names_ = 'x'; }
  std::string finish() const { return bytes_ + std::string(1024, '\0'); }
  const std::string& so_far() const { return bytes_; }

 private:
  void header(const std::string& name, size_t size, char type) {
    char h[512] = {};
    std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
    std::snprintf(h + 100, 8, "%07o", 0444);
    std::snprintf(h + 124, 12, "%011lo", static_cast<unsigned long>(size));
    std::snprintf(h + 136, 12, "%011o", 1700000000u);
    h[156] = type;
    std::memcpy(h + 257,
                "ustar\0"
                "00",
                8);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);
    bytes_.append(h, 512);
  }
  void pad_data(const std::string& d) {
    bytes_ += d;
    bytes_.append((512 - d.size() % 512) % 512, '\0');
  }
  std::string bytes_;
  char long_names_ = 'L';
};

void write_text(const std::string& path, const std::string& s) {
  std::ofstream(path, std::ios::binary) << s;
}

std::string jpeg(uint32_t seed, int64_t h = 12, int64_t w = 16) {
  const std::vector<uint8_t> b = testing::encode_jpeg(testing::smooth_image(h, w, seed));
  return std::string(b.begin(), b.end());
}

TEST(ShardPattern, ExpandsRangesListsAndNesting) {
  EXPECT_EQ(expand_shard_pattern("d/train-{000..002}.tar"),
            (std::vector<std::string>{"d/train-000.tar", "d/train-001.tar", "d/train-002.tar"}));
  EXPECT_EQ(expand_shard_pattern("s{8..10}.tar"), (std::vector<std::string>{"s8.tar", "s9.tar", "s10.tar"}));
  EXPECT_EQ(expand_shard_pattern("{a,b}-{0..1}.tar"),
            (std::vector<std::string>{"a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"}));
  EXPECT_EQ(expand_shard_pattern("x.tar,y-{1..2}.tar,z.tar"),
            (std::vector<std::string>{"x.tar", "y-1.tar", "y-2.tar", "z.tar"}));
  EXPECT_EQ(expand_shard_pattern("{p{0..1},q}.tar"), (std::vector<std::string>{"p0.tar", "p1.tar", "q.tar"}));
  EXPECT_EQ(expand_shard_pattern("s{00..010}.tar").size(), 11u);
  EXPECT_EQ(expand_shard_pattern("s{00..010}.tar")[0], "s000.tar");
  EXPECT_HAS(error_of([] { expand_shard_pattern("s{3..1}.tar"); }), "goes down");
  EXPECT_HAS(error_of([] { expand_shard_pattern("s{1..3.tar"); }), "without");
  EXPECT_HAS(error_of([] { expand_shard_pattern("s1..3}.tar"); }), "without");
  EXPECT_HAS(error_of([] { expand_shard_pattern("s{a..c}.tar"); }), "not two unsigned integers");
  EXPECT_HAS(error_of([] { expand_shard_pattern("s{0..9999999}.tar"); }), "2^20");
  TempDir dir;
  write_text(dir.str("b.tar"), "");
  write_text(dir.str("a.tar"), "");
  write_text(dir.str("a.tar.czidx"), "");
  EXPECT_EQ(expand_shard_pattern(dir.str()), (std::vector<std::string>{dir.str("a.tar"), dir.str("b.tar")}));
}

TEST(TarIndex, MembersOffsetsLongNamesAndPaxPaths) {
  TempDir dir;
  const std::string long_a(130, 'a'), long_b = std::string(120, 'b') + "/x.jpg";
  TarWriter t;
  t.dir("sub");
  t.file("k0.cls", "3");
  t.file("k0.jpg", std::string(700, 'j'));
  t.file(long_a + ".cls", "1");
  t.use_pax();
  t.file(long_b, "pax");
  write_text(dir.str("s.tar"), t.finish());
  const TarIndex index = scan_tar(dir.str("s.tar"));
  EXPECT_EQ(index.error, "");
  ASSERT_EQ(index.members.size(), 4u);
  EXPECT_EQ(index.members[0].name, "k0.cls");
  EXPECT_EQ(index.members[0].content, "3");  // label members' bytes are kept
  EXPECT_EQ(index.members[1].name, "k0.jpg");
  EXPECT_EQ(index.members[1].size, 700u);
  EXPECT_EQ(index.members[1].content, "");
  EXPECT_EQ(index.members[2].name, long_a + ".cls");
  EXPECT_EQ(index.members[3].name, long_b);
  const std::string all = t.finish();
  EXPECT_EQ(all.substr(index.members[1].offset, 700), std::string(700, 'j'));
  EXPECT_EQ(all.substr(index.members[3].offset, 3), "pax");
  TarIndex back;
  ASSERT_TRUE(parse_index(serialize_index(index), back));
  EXPECT_EQ(back.members.size(), 4u);
  EXPECT_EQ(back.members[3].name, long_b);
  EXPECT_EQ(back.file_size, index.file_size);
  EXPECT_FALSE(parse_index("CZTARIX1 and then nothing", back));
}

TEST(TarIndex, BuiltOnceAndRebuiltWhenTheShardChanges) {
  TempDir dir;
  TarWriter t;
  t.file("a.cls", "0");
  t.file("a.jpg", "x");
  write_text(dir.str("s.tar"), t.finish());
  bool built = false;
  load_or_build_index(dir.str("s.tar"), "", &built);
  EXPECT_TRUE(built);
  EXPECT_TRUE(fs::exists(dir.str("s.tar.czidx")));
  const TarIndex again = load_or_build_index(dir.str("s.tar"), "", &built);
  EXPECT_FALSE(built);
  EXPECT_EQ(again.members.size(), 2u);
  t.file("b.cls", "1");
  write_text(dir.str("s.tar"), t.finish());  // another size
  EXPECT_EQ(load_or_build_index(dir.str("s.tar"), "", &built).members.size(), 3u);
  EXPECT_TRUE(built);
  // Same size, another time: rebuilt too.
  struct timespec times[2] = {{0, UTIME_OMIT}, {1600000000, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, dir.str("s.tar").c_str(), times, 0), 0);
  load_or_build_index(dir.str("s.tar"), "", &built);
  EXPECT_TRUE(built);
  // In a cache folder of its own when asked.
  load_or_build_index(dir.str("s.tar"), dir.str("cache"), &built);
  EXPECT_TRUE(built);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.str("cache")), fs::directory_iterator()), 1);
  load_or_build_index(dir.str("s.tar"), dir.str("cache"), &built);
  EXPECT_FALSE(built);
}

TEST(TarIndex, TruncatedCompressedAndForeignFilesSaySo) {
  TempDir dir;
  TarWriter t;
  t.file("a.cls", "0");
  t.file("a.jpg", std::string(2000, 'x'));
  const std::string whole = t.finish();
  write_text(dir.str("cut.tar"), whole.substr(0, 1024 + 1000));  // inside a.jpg's data
  EXPECT_HAS(scan_tar(dir.str("cut.tar")).error, "truncated: member a.jpg needs bytes");
  write_text(dir.str("end.tar"), t.so_far());  // whole members, no end-of-archive blocks
  EXPECT_HAS(scan_tar(dir.str("end.tar")).error, "without the end-of-archive blocks");
  EXPECT_EQ(scan_tar(dir.str("end.tar")).members.size(), 2u);
  write_text(dir.str("hdr.tar"), t.so_far() + std::string(100, 'h'));
  EXPECT_HAS(scan_tar(dir.str("hdr.tar")).error, "inside the header");
  write_text(dir.str("z.tar.gz"), std::string("\x1f\x8b\x08\x00", 4) + std::string(600, 'z'));
  EXPECT_HAS(error_of([&] { scan_tar(dir.str("z.tar.gz")); }), "a gzip-compressed tar");
  write_text(dir.str("junk.tar"), std::string(1024, 'j'));
  EXPECT_HAS(scan_tar(dir.str("junk.tar")).error, "not a tar file");
}

// Shards of JPEGs labelled by .cls and .json, with classes.txt; the folder of the same files.
struct Fixture {
  TempDir dir;
  std::vector<int> labels;
  explicit Fixture(const std::vector<int>& per_shard, bool classes = true) {
    int k = 0;
    for (size_t s = 0; s < per_shard.size(); ++s) {
      TarWriter t;
      for (int i = 0; i < per_shard[s]; ++i, ++k) {
        const int label = (k * 7) % 3;
        const std::string key = "img" + std::to_string(k);
        if (k % 2 == 0)
          t.file(key + ".cls", std::to_string(label) + "\n");
        else
          t.file(key + ".json", "{\"label\": " + std::to_string(label) + ", \"w\": 16}");
        t.file(key + ".jpg", jpeg(uint32_t(k)));
        t.file(key + ".txt", "a caption");
        labels.push_back(label);
        fs::create_directories(dir.path() / "folder" / ("c" + std::to_string(label)));
        write_text(dir.str("folder/c" + std::to_string(label) + "/" + key + ".jpg"), jpeg(uint32_t(k)));
      }
      write_text(dir.str("s-" + std::to_string(s) + ".tar"), t.finish());
    }
    if (classes) write_text(dir.str("classes.txt"), "cat\ncoffee\nrocket\n");
  }
  std::string spec(size_t n) const { return "wds:" + dir.str("s-{0.." + std::to_string(n - 1) + "}.tar"); }
};

TEST(WdsSource, SamplesInShardOrderWithTheirLabelsAndPixels) {
  Fixture f({3, 5, 1});
  auto data = open_dataset(f.spec(3), Split::train, {});
  ASSERT_EQ(data->size(), 9);
  EXPECT_EQ(data->num_classes(), 3);
  EXPECT_EQ(data->class_names(), (std::vector<std::string>{"cat", "coffee", "rocket"}));
  EXPECT_HAS(data->describe(), "3 shard(s), 9 images, 3 classes: cat, coffee, rocket; 3 index(es) built");
  for (int64_t i = 0; i < 9; ++i) {
    EXPECT_EQ(data->label(i), f.labels[size_t(i)]) << i;
    Image img, want;
    data->read(i, img);
    const std::string bytes = jpeg(uint32_t(i));
    decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "fixture", want);
    EXPECT_EQ(img.pixels, want.pixels) << i;
  }
  // Opened again: the indexes are read, not built.
  EXPECT_EQ(open_dataset(f.spec(3), Split::train, {})->describe().find("built"), std::string::npos);
  // Without classes.txt: the labels' range, no names.
  fs::remove(f.dir.str("classes.txt"));
  auto bare = open_dataset(f.spec(3), Split::train, {});
  EXPECT_EQ(bare->num_classes(), 3);
  EXPECT_TRUE(bare->class_names().empty());
}

// What the loader reads of a shard's image (the crop-aware decode) equals what it reads of the same file in a
// folder.
TEST(WdsSource, CropsEqualTheFoldersOfTheSameFiles) {
  Fixture f({4, 4});
  auto shards = open_dataset(f.spec(2), Split::train, {});
  auto folder = open_dataset("folder:" + f.dir.str("folder"), Split::train, {});
  ASSERT_EQ(shards->size(), folder->size());
  const auto choose = [](int64_t h, int64_t w) { return CropBox{1, 2, h - 3, w - 4, true}; };
  for (int64_t i = 0; i < shards->size(); ++i) {
    Image whole, a, b;
    shards->read(i, whole);
    int64_t j = 0;  // the folder's order is by class, then name
    for (Image other; j < folder->size(); ++j) {
      folder->read(j, other);
      if (other.pixels == whole.pixels) break;
    }
    ASSERT_LT(j, folder->size());
    CropBox ba, bb;
    shards->read_crop(i, choose, 8, a, ba);
    folder->read_crop(j, choose, 8, b, bb);
    EXPECT_EQ(a.pixels, b.pixels) << i;
    EXPECT_EQ(ba.h, bb.h);
    EXPECT_EQ(ba.flip, bb.flip);
  }
}

// Note [Sampling] over shards of 30, 3 and 1 samples: every rank the same number of batches of the same size,
// and together the global order's first batches, each sample once.
TEST(WdsSource, EqualSharesWhateverTheShardSizes) {
  Fixture f({30, 3, 1});
  auto data = open_dataset(f.spec(3), Split::train, {});
  ASSERT_EQ(data->size(), 34);
  for (int world : {2, 3}) {
    std::vector<int64_t> seen;
    int64_t batches = -1;
    for (int rank = 0; rank < world; ++rank) {
      LoaderOptions o = testing::loader_options(4 * world, 8);
      o.threads = 1;
      o.world = world;
      o.rank = rank;
      o.seed = 5;
      Loader loader(data, o);
      int64_t n = 0;
      for (std::optional<Batch> b = loader.next(); b; b = loader.next(), ++n) {
        EXPECT_EQ(b->labels.numel(), 4);
        seen.insert(seen.end(), b->sources.begin(), b->sources.end());
      }
      if (batches >= 0) {
        EXPECT_EQ(n, batches);
      }
      batches = n;
    }
    EXPECT_EQ(batches, 34 / (4 * world));
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), seen.size());
  }
}

struct BadCase {
  const char* what;
  std::function<void(TarWriter&)> write;
  const char* message;
};

TEST(WdsSource, EveryBadInputIsNamedOrWithABudgetLeftOut) {
  const std::vector<BadCase> cases = {
      {"no label", [](TarWriter& t) { t.file("bad.jpg", jpeg(1)); },
       "s-1.tar: member bad.jpg: no label member"},
      {"no image", [](TarWriter& t) { t.file("bad.cls", "1"); }, "s-1.tar: member bad: no image member"},
      {"label out of range",
       [](TarWriter& t) {
         t.file("bad.cls", "3");
         t.file("bad.jpg", jpeg(1));
       },
       "s-1.tar: member bad.cls: label 3 out of range [0, 3) (classes.txt has 3 names)"},
      {"negative label",
       [](TarWriter& t) {
         t.file("bad.cls", "-1");
         t.file("bad.jpg", jpeg(1));
       },
       "member bad.cls: label -1 out of range"},
      {"label not a number",
       [](TarWriter& t) {
         t.file("bad.cls", "cat");
         t.file("bad.jpg", jpeg(1));
       },
       "member bad.cls: label not an integer ('cat')"},
      {"json without label",
       [](TarWriter& t) {
         t.file("bad.jpg", jpeg(1));
         t.file("bad.json", "{\"cls\": 1}");
       },
       "member bad.json: label no integer \"label\" field"},
      {"webp",
       [](TarWriter& t) {
         t.file("bad.cls", "1");
         t.file("bad.webp", "RIFF");
       },
       "member bad: a .webp image"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    Fixture f({2});
    TarWriter t;
    t.file("good.cls", "0");
    t.file("good.jpg", jpeg(2));
    c.write(t);
    write_text(f.dir.str("s-1.tar"), t.finish());
    EXPECT_HAS(error_of([&] { open_dataset(f.spec(2), Split::train, {}); }), c.message);
    DatasetOptions skip;
    skip.skip_bad_samples = 1;
    auto data = open_dataset(f.spec(2), Split::train, skip);
    EXPECT_EQ(data->size(), 3);
    EXPECT_EQ(data->bad_samples(), 1);
    EXPECT_HAS(data->describe(), "skipped 1 bad sample(s)");
  }
  Fixture f({2});
  EXPECT_HAS(error_of([&] { open_dataset(f.spec(3), Split::train, {}); }), "s-1.tar does not exist");
  write_text(f.dir.str("s-1.tar"), std::string("\x1f\x8b\x08\x00", 4) + std::string(600, 'z'));
  EXPECT_HAS(error_of([&] { open_dataset(f.spec(2), Split::train, {}); }), "s-1.tar: a gzip-compressed tar");
  // A truncated shard: its last sample lost, named, and left out with a budget.
  TarWriter t;
  t.file("a.cls", "0");
  t.file("a.jpg", jpeg(3));
  t.file("b.cls", "0");
  t.file("b.jpg", jpeg(4));
  const std::string whole = t.finish();
  write_text(f.dir.str("s-1.tar"), whole.substr(0, whole.size() - 1024 - 300));
  EXPECT_HAS(error_of([&] { open_dataset(f.spec(2), Split::train, {}); }),
             "s-1.tar: truncated: member b.jpg");
  DatasetOptions skip;
  skip.skip_bad_samples = 1;
  EXPECT_EQ(open_dataset(f.spec(2), Split::train, skip)->size(), 3);
  // More bad samples than the budget: all counted and named.
  TarWriter two;
  two.file("x.jpg", jpeg(1));
  two.file("y.jpg", jpeg(1));
  write_text(f.dir.str("s-1.tar"), two.finish());
  EXPECT_HAS(error_of([&] { open_dataset(f.spec(2), Split::train, skip); }),
             "2 bad samples, more than --skip-bad-samples 1");
}

// Note [Skipping bad samples]: a corrupt image inside a shard stops the loader naming shard and member, or
// is replaced by the next sample within the budget.
TEST(WdsSource, CorruptImageNamedOrReplacedByTheNextSample) {
  Fixture f({2});
  TarWriter t;
  t.file("bad.cls", "1");
  std::string broken = jpeg(5);
  broken.resize(broken.size() / 2);
  t.file("bad.jpg", broken);
  t.file("next.cls", "2");
  t.file("next.jpg", jpeg(6));
  write_text(f.dir.str("s-1.tar"), t.finish());
  auto data = open_dataset(f.spec(2), Split::train, {});
  ASSERT_EQ(data->size(), 4);
  LoaderOptions o = testing::in_order(4, 8);
  o.threads = 1;
  {
    Loader loader(data, o);
    EXPECT_HAS(error_of([&] { loader.next(); }), "s-1.tar: member bad.jpg");
  }
  o.skip_bad_samples = 1;
  Loader loader(data, o);
  const std::optional<Batch> b = loader.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->sources, (std::vector<int64_t>{0, 1, 3, 3}));
  EXPECT_EQ(b->labels.data<int64_t>()[2], 2);
  EXPECT_EQ(loader.skipped_samples(), 1);
}

// Random damage to a shard and to its index file: errors or a shorter table, never a crash or a member
// outside the file (the fuzz targets' property, run here on every build).
TEST(TarIndex, DamagedShardsAndIndexesAreErrorsNotCrashes) {
  TempDir dir;
  TarWriter t;
  t.file("a.cls", "0");
  t.file(std::string(120, 'l') + ".jpg", jpeg(1));
  t.use_pax();
  t.file(std::string(130, 'p') + ".json", "{\"label\": 1}");
  const std::string whole = t.finish();
  const std::string index_bytes =
      serialize_index(scan_tar((write_text(dir.str("w.tar"), whole), dir.str("w.tar"))));
  uint64_t state = 12345;
  auto next = [&] { return state = state * 6364136223846793005ull + 1442695040888963407ull, state >> 33; };
  for (int i = 0; i < 600; ++i) {
    std::string tar = whole, idx = index_bytes;
    for (int k = 0, n = 1 + int(next() % 8); k < n; ++k) {
      tar[next() % tar.size()] = char(next());
      idx[next() % idx.size()] = char(next());
    }
    if (i % 3 == 0) tar.resize(next() % tar.size());
    write_text(dir.str("d.tar"), tar);
    try {
      const TarIndex index = scan_tar(dir.str("d.tar"));
      for (const TarMember& m : index.members) EXPECT_LE(m.offset + m.size, tar.size());
    } catch (const IoError&) {
    }
    TarIndex parsed;
    (void)parse_index(idx, parsed);
  }
}

}  // namespace
}  // namespace cz
