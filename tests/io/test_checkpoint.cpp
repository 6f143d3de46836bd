// Sharded checkpoints with ranks as threads: round trips, resharding by ranges, the commit protocol (latest,
// keep, leftovers, re-saves), the background writer, export, and the HDF5 pieces beneath (Fletcher-32 chunks,
// virtual datasets).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "checkpoint_testing.h"
#include "common/error_of.h"
#include "io/checkpoint/checkpoint.h"
#include "io/h5/fletcher32.h"
#include "io/h5/h5_file.h"
#include "io_testing.h"

namespace cz {
namespace {

using ckpt::Checkpoint;
using ckpt::SaveRequest;
using testing::TempDir;
namespace fs = std::filesystem;

// Saves step `step` of small_model() at `world` ranks (flat partition, all four groups).
void save_step(const std::string& dir, int world, int64_t step, int64_t keep = 0, int64_t align = 4) {
  const testing::TensorList tensors = testing::small_model();
  const FlatLayout layout = testing::flat_layout(tensors, align);
  const auto errors = testing::run_ranks(world, [&](int rank, ckpt::Collective& comm) {
    SaveRequest r{.dir = dir, .step = step, .stage = 2, .keep = keep};
    r.groups = testing::rank_state(tensors, layout, world, rank, step, testing::all_groups());
    r.tensors = testing::infos(tensors);
    r.scalars = testing::global_scalars(step);
    r.rank_scalars = testing::rank_scalars(step, rank);
    const ckpt::SaveResult res = ckpt::save_checkpoint(std::move(r), comm);
    EXPECT_EQ(res.path, fmt::format("{}/step_{}", dir, step));
    EXPECT_GT(res.rank_bytes, 0);
    EXPECT_GT(res.bytes, res.rank_bytes);
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
}

// Reads every group at an M-rank partition (another alignment than the writer's) and counts wrong values.
int64_t wrong_at(const Checkpoint& c, int world, int64_t step, int64_t align) {
  const testing::TensorList tensors = testing::small_model();
  const FlatLayout layout = testing::flat_layout(tensors, align);
  int64_t wrong = 0;
  for (int rank = 0; rank < world; ++rank)
    for (const ckpt::StateGroup& g :
         testing::rank_state(tensors, layout, world, rank, 0, testing::all_groups())) {
      const std::vector<ckpt::ShardSlice> slices = testing::blank_like(g.slices);
      c.read_slices(g.name, slices);
      for (const ckpt::ShardSlice& s : slices) wrong += testing::count_wrong(s, tensors, step, g.name);
    }
  return wrong;
}

TEST(Checkpoint, RoundTripAtOneTwoFourRanks) {
  for (int world : {1, 2, 4}) {
    TempDir dir;
    save_step(dir.path().string(), world, 12);
    const Checkpoint c = Checkpoint::open(dir.path().string());
    EXPECT_EQ(c.path(), dir.str("step_12"));
    EXPECT_EQ(c.step(), 12);
    EXPECT_EQ(c.world_size(), world);
    EXPECT_EQ(c.stage(), 2);
    EXPECT_EQ(c.scalars(), testing::global_scalars(12));
    for (int r = 0; r < world; ++r) EXPECT_EQ(c.rank_scalars(r), testing::rank_scalars(12, r)) << r;
    EXPECT_EQ(c.groups(), (std::vector<std::string>{"params", "exp_avg", "exp_avg_sq", "ema"}));
    ASSERT_EQ(c.tensors("ema").size(), testing::small_model().size());
    EXPECT_EQ(c.shape("params", "stem.0.weight"), (Shape{8, 3, 4, 4}));
    EXPECT_EQ(wrong_at(c, world, 12, 4), 0) << world;
    c.verify();
    EXPECT_FALSE(fs::exists(dir.str(".tmp-step_12")));
    std::ifstream latest(dir.str("latest"));
    std::string name;
    latest >> name;
    EXPECT_EQ(name, "step_12");
  }
}

TEST(Checkpoint, ReshardsByRangesFromAnyWorldSize) {
  for (int saved : {1, 3, 4}) {
    TempDir dir;
    save_step(dir.path().string(), saved, 5, 0, /*align=*/1);
    const Checkpoint c = Checkpoint::open(dir.path().string());
    for (int world : {1, 2, 3, 4, 7})
      EXPECT_EQ(wrong_at(c, world, 5, /*align=*/16), 0) << saved << "->" << world;
    // Arbitrary ranges of one tensor, straddling the writers' slice boundaries.
    std::mt19937 rng(saved);
    const int64_t n = 392;
    const Tensor full = c.read_tensor("exp_avg", "stages.0.blocks.0.conv_dw.weight");
    ASSERT_EQ(full.sizes(), (Shape{8, 1, 7, 7}));
    const std::vector<float> all = full.to_vector<float>();
    for (int trial = 0; trial < 50; ++trial) {
      const int64_t b = int64_t(rng() % n), len = int64_t(rng() % (n - b + 1));
      Tensor part = empty({len});
      c.read("exp_avg", "stages.0.blocks.0.conv_dw.weight", b, part);
      const std::vector<float> got = part.to_vector<float>();
      EXPECT_TRUE(std::equal(got.begin(), got.end(), all.begin() + b)) << b << "+" << len;
    }
    EXPECT_EQ(all[100], testing::value_at(5, 1, 2, 100));
  }
}

TEST(Checkpoint, MoreRankFilesThanAreKeptOpen) {
  // 70 ranks (files), read by one process: the reader keeps at most 64 open, closing the least recently used.
  TempDir dir;
  save_step(dir.path().string(), 70, 2);
  const Checkpoint c = Checkpoint::open(dir.path().string());
  EXPECT_EQ(wrong_at(c, 3, 2, 1), 0);
  EXPECT_EQ(c.rank_scalars(69), testing::rank_scalars(2, 69));
  c.verify();
}

TEST(Checkpoint, SeveralSlicesOfOneTensorOnOneRank) {
  // Round-robin pieces of 10 elements: every rank owns many slices of every tensor.
  TempDir dir;
  const testing::TensorList tensors = testing::small_model();
  const auto errors = testing::run_ranks(3, [&](int rank, ckpt::Collective& comm) {
    SaveRequest r{.dir = dir.path().string(), .step = 1, .stage = 3};
    ckpt::StateGroup g{"params", {}};
    for (size_t t = 0; t < tensors.size(); ++t) {
      const int64_t n = shape_numel(tensors[t].second);
      for (int64_t b = 10 * rank; b < n; b += 30) {
        const int64_t len = std::min<int64_t>(10, n - b);
        Tensor local = empty({len});
        for (int64_t i = 0; i < len; ++i) local.data<float>()[i] = testing::value_at(1, 0, int(t), b + i);
        g.slices.push_back({tensors[t].first, tensors[t].second, b, len, local});
      }
    }
    r.groups.push_back(std::move(g));
    ckpt::save_checkpoint(std::move(r), comm);
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  const Checkpoint c = Checkpoint::open(dir.path().string());
  EXPECT_EQ(c.groups(), std::vector<std::string>{"params"});
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::vector<float> v = c.read_tensor("params", tensors[t].first).to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(v[i], testing::value_at(1, 0, int(t), int64_t(i))) << t << i;
  }
  const std::vector<std::string> datasets =
      h5::File::open(dir.str("step_1/rank_00001.h5"), {.vds_source = true}).datasets();
  EXPECT_NE(std::find(datasets.begin(), datasets.end(), "params/stem.0.weight#1"), datasets.end());
}

TEST(Checkpoint, StageZeroRankZeroOwnsEverything) {
  TempDir dir;
  const testing::TensorList tensors = testing::small_model();
  const FlatLayout layout = testing::flat_layout(tensors, 1);
  const auto errors = testing::run_ranks(2, [&](int rank, ckpt::Collective& comm) {
    SaveRequest r{.dir = dir.path().string(), .step = 3, .stage = 0};
    if (rank == 0) r.groups = testing::rank_state(tensors, layout, 1, 0, 3, {"params", "momentum_buffer"});
    r.rank_scalars = testing::rank_scalars(3, rank);
    ckpt::save_checkpoint(std::move(r), comm);
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  const Checkpoint c = Checkpoint::open(dir.path().string());
  EXPECT_EQ(c.world_size(), 2);
  EXPECT_EQ(c.stage(), 0);
  EXPECT_EQ(c.rank_scalars(1), testing::rank_scalars(3, 1));
  const Tensor fc = c.read_tensor("momentum_buffer", "head.fc.weight");
  EXPECT_EQ(fc.to_vector<float>()[17], testing::value_at(3, 4, 8, 17));
}

TEST(Checkpoint, BackgroundSaveWritesTheValuesOfItsStart) {
  TempDir dir;
  const testing::TensorList tensors = testing::small_model();
  const FlatLayout layout = testing::flat_layout(tensors, 4);
  const auto errors = testing::run_ranks(2, [&](int rank, ckpt::Collective& comm) {
    std::optional<ckpt::PendingSave> pending;  // held until the next save, as a trainer would
    for (int64_t step : {7, 8}) {
      SaveRequest r{.dir = dir.path().string(), .step = step, .stage = 1, .keep = 1};
      r.groups = testing::rank_state(tensors, layout, 2, rank, step, testing::all_groups());
      std::vector<Tensor> originals;
      for (const auto& g : r.groups)
        for (const auto& s : g.slices) originals.push_back(s.local);
      pending = ckpt::begin_save(r, comm);
      for (Tensor& t : originals) t.fill_(-1.0);  // training goes on and changes the state
      while (!pending->written()) std::this_thread::yield();
      const ckpt::SaveResult res = pending->finish();
      EXPECT_GT(res.write_seconds, 0);
    }
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  EXPECT_EQ(wrong_at(Checkpoint::open(dir.path().string()), 2, 8, 4), 0);
  // step_7 was pruned: renamed out of sight by finish(), removed before the PendingSave was gone.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_8"}));
}

TEST(Checkpoint, LatestKeepAndResaves) {
  TempDir dir;
  for (int64_t step = 1; step <= 5; ++step) save_step(dir.path().string(), 2, step, /*keep=*/2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_4", "step_5"}));
  EXPECT_EQ(Checkpoint::open(dir.path().string()).step(), 5);
  EXPECT_EQ(Checkpoint::open(dir.str("step_4/")).step(), 4);

  // Saving step 4 again (a run resumed from it) replaces it and points `latest` at it; step_5 is left alone.
  save_step(dir.path().string(), 3, 4, /*keep=*/2);
  const Checkpoint again = Checkpoint::open(dir.path().string());
  EXPECT_EQ(again.step(), 4);
  EXPECT_EQ(again.world_size(), 3);
  EXPECT_EQ(wrong_at(again, 2, 4, 1), 0);
  EXPECT_TRUE(fs::exists(dir.str("step_5")));

  // `latest` naming a folder that is gone: the highest complete step_N.
  fs::remove_all(dir.str("step_4"));
  EXPECT_EQ(Checkpoint::open(dir.path().string()).step(), 5);
}

TEST(Checkpoint, InterruptedSavesAreNeverLoadedAndAreCleanedUp) {
  TempDir dir;
  save_step(dir.path().string(), 2, 1);
  // What a crash mid-save leaves: a temporary folder, possibly with complete-looking files in it.
  fs::create_directories(dir.str(".tmp-step_2"));
  fs::copy(dir.str("step_1"), dir.str(".tmp-step_2"), fs::copy_options::recursive);
  std::ofstream(dir.str(".latest.tmp")) << "step_2";
  EXPECT_EQ(Checkpoint::open(dir.path().string()).step(), 1);
  fs::remove(dir.str("latest"));
  EXPECT_EQ(Checkpoint::open(dir.path().string()).step(), 1);
  save_step(dir.path().string(), 2, 3);
  EXPECT_FALSE(fs::exists(dir.str(".tmp-step_2")));
  EXPECT_FALSE(fs::exists(dir.str(".latest.tmp")));
  EXPECT_EQ(Checkpoint::open(dir.path().string()).step(), 3);
}

TEST(Checkpoint, ExportsAGroupAsAWeightFile) {
  TempDir dir;
  save_step(dir.path().string(), 3, 6);
  const Checkpoint c = Checkpoint::open(dir.path().string());
  const testing::TensorList tensors = testing::small_model();
  for (const std::string group : {"params", "ema"}) {
    const std::string out = dir.str(fmt::format("{}.h5", group));
    ckpt::export_weights(c, group, out);
    NamedTensorList params;
    for (const auto& [name, shape] : tensors) params.emplace_back(name, zeros(shape));
    const WeightImportReport report = import_weights(out, params);
    EXPECT_EQ(report.tensors, int64_t(tensors.size()));
    for (size_t t = 0; t < tensors.size(); ++t) {
      const std::vector<float> v = params[t].second.to_vector<float>();
      for (size_t i = 0; i < v.size(); ++i)
        ASSERT_EQ(v[i], testing::value_at(6, testing::group_id(group), int(t), int64_t(i)))
            << group << t << i;
    }
  }
  // The index file's virtual datasets are themselves a weight file (read through HDF5's VDS, while `c` has
  // the same rank files open).
  NamedTensorList params;
  for (const auto& [name, shape] : tensors) params.emplace_back(name, zeros(shape));
  WeightImportOptions ema;
  ema.group = "ema";
  import_weights(dir.str("step_6/checkpoint.h5"), params, ema);
  EXPECT_EQ(params[8].second.to_vector<float>()[33], testing::value_at(6, 3, 8, 33));
}

TEST(Checkpoint, OneProcessWithSoloCollective) {
  TempDir dir;
  const testing::TensorList tensors = testing::small_model();
  ckpt::SoloCollective solo;
  SaveRequest r{.dir = dir.path().string(), .step = 9};
  r.groups = testing::rank_state(tensors, testing::flat_layout(tensors, 16), 1, 0, 9, {"params"});
  r.tensors = testing::infos(tensors);
  EXPECT_EQ(ckpt::save_checkpoint(std::move(r), solo).path, dir.str("step_9"));
  EXPECT_EQ(Checkpoint::open(dir.str("step_9")).read_tensor("params", "head.fc.bias").to_vector<float>()[4],
            testing::value_at(9, 0, 9, 4));
}

TEST(Checkpoint, FlatRangeSlicesSkipPadding) {
  const FlatLayout layout = testing::flat_layout({{"a", {3}}, {"b", {2, 3}}, {"c", {5}}}, 4);
  // a: [0, 3), b: [4, 10), c: [12, 17); numel 20.
  const Tensor shard = arange(9, DType::f32);
  const auto slices = ckpt::slices_of_flat_range(layout, 2, 11, shard);
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[0].name, "a");
  EXPECT_EQ(slices[0].begin, 2);
  EXPECT_EQ(slices[0].numel, 1);
  EXPECT_EQ(slices[1].name, "b");
  EXPECT_EQ(slices[1].begin, 0);
  EXPECT_EQ(slices[1].numel, 6);
  EXPECT_EQ(slices[1].local.to_vector<float>(), (std::vector<float>{2, 3, 4, 5, 6, 7}));
}

TEST(H5Chunks, ChecksummedWritesReadBackThroughHdf5sFilter) {
  TempDir dir;
  const std::string path = dir.str("c.h5");
  std::mt19937 rng(3);
  std::vector<float> v(100003);
  for (float& x : v) x = float(rng()) / 7.0f;
  std::vector<uint8_t> bytes(1001);
  for (uint8_t& b : bytes) b = uint8_t(rng());
  {
    h5::File f = h5::File::create(path, {.modern_format = true});
    // Uneven chunks with a zero-padded edge chunk, a 2-D tensor and an odd byte count.
    f.write("a", from_vector<float>(v, {int64_t(v.size())}), {.checksum = true, .max_chunk_bytes = 4096});
    f.write("m", from_vector<float>(std::vector<float>(v.begin(), v.begin() + 21), {7, 3}),
            {.checksum = true, .max_chunk_bytes = 25});
    f.write("b", from_vector<uint8_t>(bytes, {int64_t(bytes.size())}),
            {.checksum = true, .max_chunk_bytes = 100});
    f.commit();
  }
  const h5::File f = h5::File::open(path);
  EXPECT_EQ(f.read("a").to_vector<float>(), v);
  EXPECT_EQ(f.read("m").sizes(), (Shape{7, 3}));
  const std::vector<int64_t> b = f.read("b").to_vector<int64_t>();
  EXPECT_TRUE(std::equal(b.begin(), b.end(), bytes.begin()));
  Tensor part = empty({5000});
  f.read_range("a", 1234, part);
  EXPECT_TRUE(std::equal(v.begin() + 1234, v.begin() + 6234, part.data<float>()));
  EXPECT_HAS(error_of<IoError>([&] { f.read_range("a", 99999, part); }), "elements [99999, 104999)");
}

TEST(H5Chunks, Fletcher32MatchesHdf5OnEdgeSizes) {
  // HDF5 verifies our sums on read; here the sums are compared with the filter's own, for lengths around
  // the 360-word fold and odd byte counts.
  TempDir dir;
  std::vector<uint8_t> data(4000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(255 - i % 7);  // large words stress the folds
  for (size_t n : {1, 2, 3, 719, 720, 721, 722, 1441, 4000}) {
    const std::string path = dir.str(fmt::format("f{}.h5", n));
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims = n;
    const hid_t space = H5Screate_simple(1, &dims, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &dims);
    H5Pset_fletcher32(dcpl);
    const hid_t ds = H5Dcreate2(file, "x", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
    std::vector<uint8_t> raw(n + 4);
    const hsize_t zero = 0;
    uint32_t filters = 0;
    ASSERT_GE(H5Dread_chunk(ds, H5P_DEFAULT, &zero, &filters, raw.data()), 0);
    uint32_t stored = 0;
    std::memcpy(&stored, raw.data() + n, 4);
    EXPECT_EQ(h5::fletcher32(data.data(), n), stored) << n;
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(file);
  }
}

TEST(H5Chunks, RangesOfDatasetsHdf5WroteItself) {
  // Chunks summed by HDF5's own filter go through our verifier (Note [Reading checksummed chunks]); a
  // contiguous dataset and an f64 one through HDF5's reader.
  TempDir dir;
  const std::string path = dir.str("h.h5");
  std::vector<float> v(10007);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.25f - 7.0f;
  std::vector<double> d(v.begin(), v.end());
  {
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t n = v.size(), chunk = 999;
    const hid_t space = H5Screate_simple(1, &n, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &chunk);
    H5Pset_fletcher32(dcpl);
    testing::write_h5_dataset(file, "plain", H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, {n}, v.data());
    testing::write_h5_dataset(file, "double", H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, {n}, d.data());
    const hid_t ds = H5Dcreate2(file, "summed", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(file);
  }
  const h5::File f = h5::File::open(path);
  for (const std::string key : {"summed", "plain"})
    for (const auto& [b, n] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 10007}, {998, 2}, {5000, 5007}, {1, 0}}) {
      Tensor part = empty({n});
      f.read_range(key, b, part);
      EXPECT_TRUE(std::equal(v.begin() + b, v.begin() + b + n, part.data<float>())) << key << " " << b;
    }
  Tensor part = empty({3}, DType::f64);
  f.read_range("double", 10004, part);
  EXPECT_EQ(part.to_vector<double>(), (std::vector<double>{d[10004], d[10005], d[10006]}));
}

TEST(H5Virtual, FlatRangesMapOntoBoxes) {
  // Random splits of a (3, 4, 5) tensor's flattening into 1-D sources: the virtual dataset reads back whole.
  TempDir dir;
  const Shape shape{3, 4, 5};
  std::mt19937 rng(9);
  std::vector<float> all(60);
  for (size_t i = 0; i < all.size(); ++i) all[i] = float(i);
  {
    h5::File src = h5::File::create(dir.str("src.h5"));
    h5::File vds = h5::File::create(dir.str("vds.h5"));
    for (int trial = 0; trial < 30; ++trial) {
      std::vector<int64_t> cuts = {0, 60};
      for (int k = 0; k < 1 + trial % 6; ++k) cuts.push_back(int64_t(rng() % 61));
      std::sort(cuts.begin(), cuts.end());
      std::vector<h5::VirtualSource> sources;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        if (cuts[k] == cuts[k + 1]) continue;
        const std::string name = fmt::format("t{}/p{}", trial, k);
        src.write(name,
                  from_vector<float>(std::vector<float>(all.begin() + cuts[k], all.begin() + cuts[k + 1]),
                                     {cuts[k + 1] - cuts[k]}));
        sources.push_back({"src.h5", name, cuts[k], cuts[k + 1] - cuts[k]});
      }
      vds.write_virtual(fmt::format("v{}", trial), shape, sources, -1.0f);
    }
    src.commit();
    vds.commit();
  }
  const h5::File vds = h5::File::open(dir.str("vds.h5"));
  for (int trial = 0; trial < 30; ++trial)
    EXPECT_EQ(vds.read(fmt::format("v{}", trial)).to_vector<float>(), all) << trial;
}

}  // namespace
}  // namespace cz
