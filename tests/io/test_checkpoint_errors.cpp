// Checkpoints from bad input: no checkpoint, not a checkpoint, another version, truncated, missing or
// corrupted files, missing tensors, slices that do not tile, bad requests, a full disk (file-size limit).
// Each is an exception naming the file and the dataset or reason, and a failed save leaves the previous
// checkpoint as it was.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "checkpoint_testing.h"
#include "common/error_of.h"
#include "io/checkpoint/checkpoint.h"
#include "io/checkpoint/weights.h"
#include "io/h5/h5_file.h"
#include "io_testing.h"

namespace cz {
namespace {

using ckpt::Checkpoint;
using ckpt::SaveRequest;
using testing::TempDir;
namespace fs = std::filesystem;

// Saves step `step` at `world` ranks; `edit(rank, request)` may spoil a rank's request. Returns each rank's
// error ("" when none).
std::vector<std::string> save(const std::string& dir, int world, int64_t step,
                              const std::function<void(int, SaveRequest&)>& edit = {},
                              int64_t numel_scale = 1) {
  testing::TensorList tensors = testing::small_model();
  if (numel_scale > 1) tensors.push_back({"stages.3.big", {numel_scale, 1000}});
  const FlatLayout layout = testing::flat_layout(tensors, 1);
  return testing::run_ranks(world, [&](int rank, ckpt::Collective& comm) {
    SaveRequest r{.dir = dir, .step = step, .stage = 1};
    r.groups = testing::rank_state(tensors, layout, world, rank, step, {"params", "ema"});
    r.tensors = testing::infos(tensors);
    r.scalars = testing::global_scalars(step);
    if (edit) edit(rank, r);
    ckpt::save_checkpoint(std::move(r), comm);
  });
}

void save_ok(const std::string& dir, int world, int64_t step) {
  for (const std::string& e : save(dir, world, step)) ASSERT_EQ(e, "");
}

// The previous checkpoint (step 1) is still the one loaded, complete, and nothing temporary is left.
void expect_step1_intact(const TempDir& dir) {
  const Checkpoint c = Checkpoint::open(dir.path().string());
  EXPECT_EQ(c.step(), 1);
  c.verify();
  EXPECT_EQ(c.read_tensor("ema", "head.fc.weight").to_vector<float>()[3], testing::value_at(1, 3, 8, 3));
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << e.path();
}

TEST(CheckpointErrors, NoCheckpoint) {
  TempDir dir;
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dir.str("nope")); }),
             dir.str("nope") + ": no such checkpoint folder");
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dir.path().string()); }),
             dir.path().string() + ": no checkpoint here");
  fs::create_directories(dir.str(".tmp-step_3"));
  std::ofstream(dir.str("latest")) << "step_3\n";
  const std::string e = error_of<IoError>([&] { Checkpoint::open(dir.path().string()); });
  EXPECT_HAS(e, "'latest' names step_3, which is incomplete or gone");
  EXPECT_HAS(e, "interrupted save");
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dir.str("step_3")); }), "no such checkpoint folder");
}

TEST(CheckpointErrors, NotACheckpointOrAnotherVersion) {
  TempDir dir;
  fs::create_directories(dir.str("step_1"));
  std::ofstream(dir.str("step_1/checkpoint.h5")) << "not hdf5";
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dir.path().string()); }),
             "checkpoint.h5: not an HDF5 file");
  export_weights(dir.str("step_1/checkpoint.h5"), {{"w", ones({2})}});
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dir.path().string()); }),
             "checkpoint.h5: format is 'convnext_zero.weights', not a convnext_zero checkpoint");

  TempDir dir2;
  save_ok(dir2.path().string(), 1, 1);
  const std::string index = dir2.str("step_1/checkpoint.h5");
  const hid_t f = H5Fopen(index.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  const hid_t a = H5Aopen(f, "version", H5P_DEFAULT);
  const int64_t two = 2;
  H5Awrite(a, H5T_NATIVE_INT64, &two);
  H5Aclose(a);
  H5Fclose(f);
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dir2.path().string()); }),
             index + ": checkpoint format version 2; this build reads version 1");
}

TEST(CheckpointErrors, TruncatedOrMissingRankFile) {
  TempDir dir;
  save_ok(dir.path().string(), 2, 1);
  const std::string rank1 = dir.str("step_1/rank_00001.h5");
  const auto size = fs::file_size(rank1);
  fs::resize_file(rank1, size / 2);
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dir.path().string()); }),
             fmt::format("{}: {} bytes, but {} were written: truncated", rank1, size / 2, size));
  fs::remove(rank1);
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dir.path().string()); }), rank1 + ": missing");
}

// Note [Probing HDF5 files]: an index or rank file that crashes libhdf5 is an IoError naming it. A rank file
// is probed when a read first needs it; the damaged one here is padded to its recorded size, so that only
// the probe can tell.
TEST(CheckpointErrors, FilesThatCrashLibhdf5AreNamed) {
  TempDir dir;
  save_ok(dir.path().string(), 2, 1);
  const std::string crash = CZ_KNOWN_CRASHES "/libhdf5_accum_read_null_memcpy.h5";
  const std::string rank1 = dir.str("step_1/rank_00001.h5");
  const auto size = fs::file_size(rank1);
  ASSERT_GT(size, fs::file_size(crash));
  fs::copy_file(crash, rank1, fs::copy_options::overwrite_existing);
  fs::resize_file(rank1, size);
  const Checkpoint c = Checkpoint::open(dir.path().string());
  EXPECT_HAS(error_of<IoError>([&] { c.verify(); }), rank1 + ": libhdf5 crashed (SIGSEGV) while ");
  // The index read as a weight file goes through its virtual datasets into the rank files: probed too.
  NamedTensorList params;
  for (const auto& [name, shape] : testing::small_model()) params.emplace_back(name, zeros(shape));
  const std::string index = dir.str("step_1/checkpoint.h5");
  WeightImportOptions options;
  options.group = "params";
  EXPECT_HAS(error_of<IoError>([&] { import_weights(index, params, options); }),
             rank1 + ": libhdf5 crashed (SIGSEGV) while ");

  fs::copy_file(crash, index, fs::copy_options::overwrite_existing);
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dir.path().string()); }),
             index + ": libhdf5 crashed (SIGSEGV)");
}

TEST(CheckpointErrors, ChecksumMismatchNamesFileAndDataset) {
  TempDir dir;
  save_ok(dir.path().string(), 2, 1);
  // Flip one byte inside the stored chunk of rank 0's params/stem.0.weight.
  const std::string rank0 = dir.str("step_1/rank_00000.h5");
  haddr_t addr = 0;
  {
    const hid_t f = H5Fopen(rank0.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t ds = H5Dopen2(f, "params/stem.0.weight", H5P_DEFAULT);
    const hsize_t zero = 0;
    unsigned mask = 0;
    hsize_t size = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(ds, &zero, &mask, &addr, &size), 0);
    H5Dclose(ds);
    H5Fclose(f);
  }
  {
    std::fstream file(rank0, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(std::streamoff(addr + 40));
    char c = 0;
    file.read(&c, 1);
    c = char(c ^ 0x10);
    file.seekp(std::streamoff(addr + 40));
    file.write(&c, 1);
  }
  const Checkpoint c = Checkpoint::open(dir.path().string());  // sizes are right: found when the data is read
  const std::string e = error_of<IoError>([&] { c.read_tensor("params", "stem.0.weight"); });
  EXPECT_HAS(e, rank0);
  EXPECT_HAS(e, "'params/stem.0.weight'");
  EXPECT_HAS(e, "Fletcher32 checksum");
  EXPECT_HAS(error_of<IoError>([&] { c.verify(); }), "Fletcher32 checksum");
  EXPECT_EQ(c.read_tensor("ema", "stem.0.weight").to_vector<float>()[5], testing::value_at(1, 3, 0, 5));
}

TEST(CheckpointErrors, MissingDatasetInRankFile) {
  TempDir dir;
  save_ok(dir.path().string(), 2, 1);
  // Rewrite rank 1's file without one of its datasets, keeping the recorded size so that only the read can
  // tell (a file replaced by another of the same size).
  const std::string rank1 = dir.str("step_1/rank_00001.h5");
  const auto size = fs::file_size(rank1);
  const hid_t f = H5Fopen(rank1.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(H5Ldelete(f, "ema/head.fc.bias", H5P_DEFAULT), 0);
  H5Fclose(f);
  if (fs::file_size(rank1) != size) fs::resize_file(rank1, size);
  const Checkpoint c = Checkpoint::open(dir.path().string());
  const std::string e = error_of<IoError>([&] { c.read_tensor("ema", "head.fc.bias"); });
  EXPECT_HAS(e, rank1);
  EXPECT_HAS(e, "no dataset 'ema/head.fc.bias'");
}

TEST(CheckpointErrors, MissingTensorsAndMismatchedSlices) {
  TempDir dir;
  save_ok(dir.path().string(), 1, 1);
  const Checkpoint c = Checkpoint::open(dir.path().string());
  EXPECT_HAS(error_of<IoError>([&] { c.read_tensor("params", "stages.9.nope"); }),
             dir.str("step_1") + ": no tensor 'stages.9.nope' in group 'params'");
  EXPECT_HAS(error_of<IoError>([&] { c.read_tensor("exp_avg", "stem.0.bias"); }),
             "no group 'exp_avg' (it has: params, ema)");
  const std::vector<ckpt::ShardSlice> wrong_shape = {{"stem.0.bias", {9}, 0, 8, zeros({8})}};
  EXPECT_HAS(error_of<IoError>([&] { c.read_slices("params", wrong_shape); }),
             "params/stem.0.bias has shape (8), but the slice to fill is of a tensor of shape (9)");
  EXPECT_HAS(error_of<ValueError>([&] { c.read("params", "stem.0.bias", 5, zeros({4})); }),
             "elements [5, 9) were asked for");
  EXPECT_THROW(c.read("params", "stem.0.bias", 0, zeros({2}, DType::f64)), ValueError);
}

TEST(CheckpointErrors, SlicesThatDoNotTileAreRefused) {
  TempDir dir;
  save_ok(dir.path().string(), 2, 1);
  // Rank 1 forgets its last slice of "ema": a gap.
  for (const std::string& e : save(dir.path().string(), 2, 2, [](int rank, SaveRequest&r) {
         if (rank == 1) r.groups[1].slices.pop_back();
       })) {
    EXPECT_HAS(e, dir.str("step_2") +
                      " not saved: rank 0: the ranks' slices do not cover every tensor exactly once");
    EXPECT_HAS(e, "ema/head.fc.scale: elements [0, 1) of (1) are in no rank's slice");
  }
  expect_step1_intact(dir);
  // A tensor that is not the model's, and one of another shape.
  for (const std::string& e : save(dir.path().string(), 2, 2, [](int rank, SaveRequest&r) {
         if (rank == 1) r.groups[0].slices.push_back({"stages.5.extra", {2}, 0, 2, zeros({2})});
         if (rank == 1) r.groups[1].slices.back().shape = {1, 1};
       })) {
    EXPECT_HAS(e,
               "params/stages.5.extra: rank 1 has a slice of it, but it is not among the 11 tensors listed");
    EXPECT_HAS(e, "ema/head.fc.scale: rank 1 has shape (1, 1), but the listed was (1)");
  }
  expect_step1_intact(dir);
  // Rank 0 also claims rank 1's first slice of "params": an overlap.
  for (const std::string& e : save(dir.path().string(), 2, 2, [](int rank, SaveRequest&r) {
         if (rank == 0) r.groups[0].slices.push_back({"head.fc.scale", {1}, 0, 1, zeros({1})});
       }))
    EXPECT_HAS(e, "params/head.fc.scale: elements [0, 1) are in slices of ranks 0 and 1");
  expect_step1_intact(dir);
}

TEST(CheckpointErrors, BadRequestsAreReportedOnEveryRank) {
  TempDir dir;
  save_ok(dir.path().string(), 2, 1);
  for (const std::string& e : save(dir.path().string(), 2, 2, [](int rank, SaveRequest&r) {
         if (rank == 1) r.groups[0].slices[0].local = r.groups[0].slices[0].local.to(DType::f64);
       })) {
    EXPECT_HAS(e, "not saved: rank 1: save_checkpoint: group 'params', slice");
    EXPECT_HAS(e, "local must be a contiguous f32 tensor");
  }
  for (const std::string& e :
       save(dir.path().string(), 2, 2, [](int rank, SaveRequest&r) { r.scalars.ints["step"] = 1; }))
    EXPECT_HAS(e, "scalar name 'step' is reserved");
  for (const std::string& e :
       save(dir.path().string(), 2, 2, [](int, SaveRequest& r) { r.groups[0].name = "state"; }))
    EXPECT_HAS(e, "group name 'state' is reserved");
  expect_step1_intact(dir);
  std::ofstream(dir.str("file")) << "x";
  for (const std::string& e : save(dir.str("file"), 2, 1)) EXPECT_HAS(e, dir.str("file"));
}

TEST(CheckpointErrors, FileSizeLimitWhileSaving) {
  TempDir dir;
  save_ok(dir.path().string(), 2, 1);
  // As `ulimit -f 64` would: writes past 64 KiB fail (EFBIG; SIGXFSZ is ignored by the save) and the error
  // names the rank file.
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit limit = old;
  limit.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  const std::vector<std::string> errors = save(dir.path().string(), 2, 2, {}, /*numel_scale=*/40);
  setrlimit(RLIMIT_FSIZE, &old);
  for (const std::string& e : errors) {
    EXPECT_HAS(e, dir.str("step_2") + " not saved: rank ");
    EXPECT_HAS(e, "rank_0000");
    EXPECT_HAS(e, "File too large");
  }
  expect_step1_intact(dir);
}

}  // namespace
}  // namespace cz
