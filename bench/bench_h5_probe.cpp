// bench_h5_probe: what Note [Probing HDF5 files] costs per file, against the open it protects. Writes a 1 GB
// h5: data set (images uint8 (N, 224, 224, 3) and labels i64 (N), contiguous and in one-image chunks) and
// a ConvNeXt checkpoint (params, exp_avg, exp_avg_sq, ema; default convnext_tiny) at each world size, all
// under DIR, and reports medians of REPS runs, warm (files in the page cache) and cold (dropped from it
// first), of: the probe of each kind of file; the in-process open it precedes (for a data set: H5Fopen, the
// two datasets, the labels, as open_h5 does; for a checkpoint: Checkpoint::open without its index probe);
// and for scale, the whole open_dataset and a full checkpoint load, which include the probes. Removes DIR.
//   bench_h5_probe DIR [--reps 7] [--ranks 1,4] [--model convnext_tiny]
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint_testing.h"
#include "host_time.h"
#include "io/checkpoint/checkpoint.h"
#include "io/data/dataset.h"
#include "io/h5/h5_file.h"
#include "io/h5/h5_probe.h"
#include "nn/convnext.h"
#include "page_cache.h"

namespace {

using namespace cz;
namespace fs = std::filesystem;
using bench::median;

constexpr hsize_t kSide = 224;
constexpr hsize_t kImageBytes = kSide * kSide * 3;

// Median milliseconds of `reps` runs of `fn`, each after `before` (evicting files, or nothing).
double time_ms(int reps, const std::function<void()>& before, const std::function<void()>& fn) {
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    before();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(ms);
}

// `n` images of kSide x kSide, written 64 at a time; `chunked`: one image per chunk.
void write_data_set(const std::string& path, hsize_t n, bool chunked) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t dims[4] = {n, kSide, kSide, 3}, chunk[4] = {1, kSide, kSide, 3};
  const hid_t space = H5Screate_simple(4, dims, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (chunked) H5Pset_chunk(dcpl, 4, chunk);
  const hid_t images = H5Dcreate2(file, "images", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  std::vector<uint8_t> block(64 * kImageBytes);
  for (size_t i = 0; i < block.size(); ++i) block[i] = uint8_t(i * 2654435761u >> 24);
  for (hsize_t first = 0; first < n; first += 64) {
    const hsize_t start[4] = {first, 0, 0, 0}, count[4] = {std::min<hsize_t>(64, n - first), kSide, kSide, 3};
    const hid_t fspace = H5Dget_space(images);
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
    const hid_t mspace = H5Screate_simple(4, count, nullptr);
    H5Dwrite(images, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, block.data());
    H5Sclose(mspace);
    H5Sclose(fspace);
  }
  std::vector<int64_t> labels(n);
  for (hsize_t i = 0; i < n; ++i) labels[i] = int64_t(i % 1000);
  const hid_t lspace = H5Screate_simple(1, &n, nullptr);
  const hid_t ldset =
      H5Dcreate2(file, "labels", H5T_STD_I64LE, lspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ldset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data());
  for (hid_t id : {ldset, lspace, images, dcpl, space}) H5Idec_ref(id);
  H5Fclose(file);
}

// What open_h5 does in-process once the probe has passed: open, the datasets' types and shapes, the labels.
void open_data_set_in_process(const std::string& path) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t images = H5Dopen2(file, "images", H5P_DEFAULT), labels = H5Dopen2(file, "labels", H5P_DEFAULT);
  const hid_t itype = H5Dget_type(images), ispace = H5Dget_space(images), lspace = H5Dget_space(labels);
  std::vector<int64_t> values(size_t(H5Sget_simple_extent_npoints(lspace)));
  H5Dread(labels, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  for (hid_t id : {lspace, ispace, itype, labels, images}) H5Idec_ref(id);
  H5Fclose(file);
}

void bench_data_set(const std::string& dir, int reps) {
  const hsize_t n = (hsize_t{1} << 30) / kImageBytes + 1;  // just over 1 GiB of pixels
  for (bool chunked : {false, true}) {
    const std::string path = dir + (chunked ? "/chunked.h5" : "/contiguous.h5");
    write_data_set(path, n, chunked);
    auto cold = [&] { evict_from_page_cache(path); };
    auto warm = [] {};
    const h5::ProbeReport r = h5::probe_file(path, path);
    std::printf("h5: data set, %llu images 224x224x3 (%.2f GB), %s: %lld datasets, %lld sampled bytes\n",
                (unsigned long long)n, double(fs::file_size(path)) / 1e9,
                chunked ? "one image per chunk" : "contiguous", (long long)r.datasets,
                (long long)r.sampled_bytes);
    for (const auto& [label, before] :
         {std::pair<const char*, std::function<void()>>{"warm", warm}, {"cold", cold}}) {
      const double probe = time_ms(reps, before, [&] { h5::probe_file(path, path); });
      const double open = time_ms(reps, before, [&] { open_data_set_in_process(path); });
      const double whole = time_ms(reps, before, [&] { open_dataset("h5:" + path, Split::train, {}); });
      std::printf("  %s: probe %7.2f ms   in-process open %7.2f ms   open_dataset (both) %7.2f ms\n", label,
                  probe, open, whole);
    }
    fs::remove(path);
  }
}

void bench_checkpoint(const std::string& dir, int reps, int world, const std::string& model) {
  nn::ConvNeXtConfig cfg = nn::convnext_variant(model);
  testing::TensorList tensors;
  {
    nn::ConvNeXt net(cfg);
    for (const auto& [name, t] : net.named_parameters()) tensors.push_back({name, t.sizes()});
  }
  const FlatLayout layout = testing::flat_layout(tensors, 1);
  const std::vector<std::string> groups = {"params", "exp_avg", "exp_avg_sq", "ema"};
  const std::string ckdir = dir + "/ck" + std::to_string(world);
  for (const std::string& e : testing::run_ranks(world, [&](int rank, ckpt::Collective&comm) {
         ckpt::SaveRequest r{.dir = ckdir, .step = 1, .stage = 2};
         r.groups = testing::rank_state(tensors, layout, world, rank, 1, groups);
         r.tensors = testing::infos(tensors);
         ckpt::save_checkpoint(std::move(r), comm);
       }))
    if (!e.empty()) throw std::runtime_error(e);
  const std::string step = ckdir + "/step_1", index = step + "/checkpoint.h5",
                    rank0 = step + "/rank_00000.h5";
  std::vector<std::string> files;
  int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(step)) {
    files.push_back(e.path().string());
    bytes += int64_t(e.file_size());
  }
  const h5::ProbeReport ri = h5::probe_file(index, index), rr = h5::probe_file(rank0, rank0);
  std::printf(
      "%s checkpoint at %d rank(s) (%.0f MB in %zu files): index %lld datasets; rank 0's file %lld datasets, "
      "%.1f MB sampled, %lld beyond the sample budget\n",
      model.c_str(), world, double(bytes) / 1e6, files.size(), (long long)ri.datasets, (long long)rr.datasets,
      double(rr.sampled_bytes) / 1e6, (long long)rr.unsampled_datasets);
  auto warm = [] {};
  auto cold = [&] {
    for (const std::string& f : files) evict_from_page_cache(f);
  };
  for (const auto& [label, before] :
       {std::pair<const char*, std::function<void()>>{"warm", warm}, {"cold", cold}}) {
    const double probe_index = time_ms(reps, before, [&] { h5::probe_file(index, index); });
    const double open_index = time_ms(reps, before, [&] { h5::File::open(index, {.probe = false}); });
    const double probe_rank = time_ms(reps, before, [&] { h5::probe_file(rank0, rank0); });
    const double open_rank = time_ms(reps, before, [&] { h5::File::open(rank0, {.probe = false}); });
    const double open = time_ms(reps, before, [&] { ckpt::Checkpoint::open(ckdir); });
    const double load = time_ms(reps, before, [&] {
      const ckpt::Checkpoint c = ckpt::Checkpoint::open(ckdir);
      for (const std::string& g : groups)
        for (const ckpt::TensorInfo& t : c.tensors(g)) c.read_tensor(g, t.name);
    });
    std::printf(
        "  %s: index: probe %7.2f ms, open %6.2f ms | a rank file: probe %7.2f ms, open %6.2f ms | "
        "Checkpoint::open %7.2f ms, full load %8.2f ms (%d+1 probes in both)\n",
        label, probe_index, open_index, probe_rank, open_rank, open, load, world);
  }
  fs::remove_all(ckdir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_h5_probe DIR [--reps 7] [--ranks 1,4] [--model convnext_tiny]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int reps = 7;
  std::vector<int> ranks = {1, 4};
  std::string model = "convnext_tiny";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--reps") reps = std::stoi(value);
    if (flag == "--model") model = value;
    if (flag == "--ranks") {
      ranks.clear();
      for (size_t at = 0; at < value.size();) {
        const size_t comma = std::min(value.find(',', at), value.size());
        ranks.push_back(std::stoi(value.substr(at, comma - at)));
        at = comma + 1;
      }
    }
  }
  fs::create_directories(dir);
  try {
    bench_data_set(dir, reps);
    for (int w : ranks) bench_checkpoint(dir, reps, w, model);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_h5_probe: %s\n", e.what());
    fs::remove_all(dir);
    return 1;
  }
  fs::remove_all(dir);
  return 0;
}
