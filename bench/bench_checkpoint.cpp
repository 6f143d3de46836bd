// bench_checkpoint: save and load time of a sharded checkpoint of a ConvNeXt (default convnext_tiny: fp32
// master weights, AdamW exp_avg and exp_avg_sq, EMA; 4 x 28.6 M floats = 458 MB) at the world size of the
// mpirun around it, as bandwidth against this machine's sequential speed measured in the same run with dd
// (write: conv=fsync; read: after dropping the file from the page cache). A save is timed until the
// checkpoint is visible and `latest` names it; removing the previous one (keep 1) is reported apart. Also the
// background save: how long training stops for the copy to host memory, and for finish() once every rank's
// file is written (agreeing, the index, the rename, `latest`, the prune).
//   mpirun -np 4 bench_checkpoint DIR [--model convnext_tiny] [--reps 3]
// (bench/checkpoint_bandwidth.sh runs 1, 2 and 4 ranks.) DIR should be on the disk checkpoints go to.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "host_time.h"
#include "io/checkpoint/checkpoint.h"
#include "mpi_collective.h"
#include "nn/convnext.h"
#include "page_cache.h"

namespace {

using namespace cz;
namespace fs = std::filesystem;
using bench::median;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes per second that dd reports for `args` (its last line: "N bytes (...) copied, T s, ...").
double dd_rate(const std::string& args) {
  const std::string cmd = "dd " + args + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return 0;
  char line[512];
  double bytes = 0, seconds = 0;
  while (std::fgets(line, sizeof line, p)) {
    double b = 0, s = 0;
    const char* copied = std::strstr(line, "copied, ");
    if (copied && std::sscanf(line, "%lf", &b) == 1 && std::sscanf(copied + 8, "%lf", &s) == 1) {
      bytes = b;
      seconds = s;
    }
  }
  ::pclose(p);
  return seconds > 0 ? bytes / seconds : 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  testing::MpiCollective comm;
  const int rank = comm.rank(), world = comm.size();
  if (argc < 2) {
    if (rank == 0) std::fprintf(stderr, "usage: bench_checkpoint DIR [--model NAME] [--reps N]\n");
    MPI_Finalize();
    return 2;
  }
  const std::string dir = argv[1];
  std::string model = "convnext_tiny";
  int reps = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--model") model = argv[i + 1];
    if (std::string(argv[i]) == "--reps") reps = std::stoi(argv[i + 1]);
  }

  // The model's tensors, flattened and split evenly (a ZeRO partition: slices straddle tensors).
  nn::ConvNeXtConfig cfg = nn::convnext_variant(model);
  std::vector<ckpt::TensorInfo> tensors;
  FlatLayout layout;
  {
    nn::ConvNeXt net(cfg);
    for (const auto& [name, t] : net.named_parameters()) {
      tensors.push_back({name, t.sizes()});
      layout.segments.push_back({name, layout.numel, t.numel(), t.sizes()});
      layout.numel += t.numel();
    }
  }
  const int64_t begin = layout.numel * rank / world, end = layout.numel * (rank + 1) / world;
  const std::vector<std::string> group_names = {"params", "exp_avg", "exp_avg_sq", "ema"};
  std::vector<ckpt::StateGroup> groups;
  for (size_t g = 0; g < group_names.size(); ++g) {
    Tensor shard = empty({end - begin});
    float* p = shard.data<float>();
    for (int64_t i = 0; i < end - begin; ++i)
      p[i] = float(uint32_t((begin + i) * 2654435761u + g) >> 8) * 1e-6f;
    groups.push_back({group_names[g], ckpt::slices_of_flat_range(layout, begin, end, shard)});
  }
  const double total_bytes = double(layout.numel) * 4 * double(group_names.size());
  if (rank == 0) {
    fs::create_directories(dir);
    std::printf("%s: %.1f M parameters x %zu groups = %.0f MB at %d ranks, %d repetitions\n", model.c_str(),
                double(layout.numel) / 1e6, group_names.size(), total_bytes / 1e6, world, reps);
  }

  std::vector<double> dd_write, dd_read, save, prune, load, copy, finish, background;
  int64_t step = 0;
  for (int rep = 0; rep < reps; ++rep) {
    if (rank == 0) {  // the disk's sequential speed, right before this repetition's checkpoint
      const std::string dd = dir + "/dd.bin";
      const int64_t count = int64_t(total_bytes) >> 22;
      dd_write.push_back(dd_rate(fmt::format("if=/dev/zero of={} bs=4M count={} conv=fsync", dd, count)));
      evict_from_page_cache(dd);
      dd_read.push_back(dd_rate(fmt::format("if={} of=/dev/null bs=4M", dd)));
      fs::remove(dd);
    }
    auto request = [&] {
      ckpt::SaveRequest r{.dir = dir, .step = ++step, .stage = 2, .keep = 1};
      r.groups = groups;
      r.tensors = tensors;
      return r;
    };
    comm.barrier();
    double t0 = now();
    const ckpt::SaveResult res = ckpt::save_checkpoint(request(), comm);
    comm.barrier();
    save.push_back(now() - t0 - res.prune_seconds);
    if (rep > 0) prune.push_back(res.prune_seconds);  // the first save has nothing to remove

    if (rank == 0)
      for (const auto& e : fs::directory_iterator(res.path)) evict_from_page_cache(e.path().string());
    comm.barrier();
    t0 = now();
    {
      const ckpt::Checkpoint c = ckpt::Checkpoint::open(dir);
      for (const ckpt::StateGroup& g : groups) c.read_slices(g.name, g.slices);
    }
    comm.barrier();
    load.push_back(now() - t0);

    comm.barrier();
    t0 = now();
    ckpt::PendingSave pending = ckpt::begin_save(request(), comm);
    copy.push_back(double(comm.all_reduce_max(int64_t((now() - t0) * 1e6))) / 1e6);
    while (!pending.written()) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // "training"
    comm.barrier();
    background.push_back(now() - t0);
    const double t1 = now();
    pending.finish();
    finish.push_back(double(comm.all_reduce_max(int64_t((now() - t1) * 1e6))) / 1e6);
  }
  if (rank == 0) {
    const double w = median(dd_write), r = median(dd_read), s = total_bytes / median(save),
                 l = total_bytes / median(load);
    std::printf("dd write (conv=fsync)  %7.2f GB/s\n", w / 1e9);
    std::printf(
        "save                   %7.2f GB/s  %6.3f s   %4.0f%% of dd   (then %.3f s removing the "
        "previous one)\n",
        s / 1e9, median(save), 100 * s / w, prune.empty() ? 0.0 : median(prune));
    std::printf("dd read (cold)         %7.2f GB/s\n", r / 1e9);
    std::printf("load (cold)            %7.2f GB/s  %6.3f s   %4.0f%% of dd\n", l / 1e9, median(load),
                100 * l / r);
    std::printf(
        "background save: training stops %.3f s to copy to host memory, files written %.3f s "
        "later, then finish() stops it %.3f s\n",
        median(copy), median(background) - median(copy), median(finish));
    std::printf("all repetitions: dd write");
    for (double v : dd_write) std::printf(" %.2f", v / 1e9);
    std::printf(" | save");
    for (double v : save) std::printf(" %.2f", total_bytes / v / 1e9);
    std::printf(" | dd read");
    for (double v : dd_read) std::printf(" %.2f", v / 1e9);
    std::printf(" | load");
    for (double v : load) std::printf(" %.2f", total_bytes / v / 1e9);
    std::printf(" GB/s\n");
    fs::remove_all(dir);
  }
  MPI_Finalize();
  return 0;
}
