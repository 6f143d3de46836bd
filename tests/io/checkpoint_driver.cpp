// checkpoint_driver: saves and checks checkpoints of test values under mpirun, for the tests that need
// separate processes (run_checkpoint_tests.sh): a rank killed with SIGKILL at a chosen point of a save, a
// file-size limit, a checkpoint written at N ranks and read at M, h5py/h5dump/cz_weights reading one.
//   checkpoint_driver save DIR STEP [--model small|ATTO-LIKE VARIANT] [--keep K] [--background]
//                               [--kill-at PHASE --kill-rank R [--kill-count N]]
//   checkpoint_driver check DIR STEP [DIR STEP]... [--model ...]
//       (each DIR's checkpoint is STEP's; every rank reads its share at this world size and compares)
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_testing.h"
#include "mpi_collective.h"
#include "nn/convnext.h"

namespace {

using namespace cz;

struct Args {
  std::string mode, dir, model = "small", kill_at;
  int64_t step = 0, keep = 0;
  std::vector<std::pair<std::string, int64_t>> more;  // check: further DIR STEP pairs
  int kill_rank = -1, kill_count = 1;
  bool background = false;
};

testing::TensorList model_tensors(const std::string& model) {
  if (model == "small") return testing::small_model();
  nn::ConvNeXtConfig cfg = nn::convnext_variant(model);
  cfg.num_classes = 10;
  testing::TensorList out;
  for (const auto& [name, t] : nn::ConvNeXt(cfg).named_parameters()) out.emplace_back(name, t.sizes());
  return out;
}

int save(const Args& a, ckpt::Collective& comm) {
  const testing::TensorList tensors = model_tensors(a.model);
  const FlatLayout layout = testing::flat_layout(tensors, 1);
  ckpt::SaveRequest r{.dir = a.dir, .step = a.step, .stage = 2, .keep = a.keep};
  r.groups = testing::rank_state(tensors, layout, comm.size(), comm.rank(), a.step, testing::all_groups());
  r.tensors = testing::infos(tensors);
  r.scalars = testing::global_scalars(a.step);
  r.rank_scalars = testing::rank_scalars(a.step, comm.rank());
  int seen = 0;
  if (comm.rank() == a.kill_rank)
    r.on_phase = [&](std::string_view phase) {
      if (phase == a.kill_at && ++seen == a.kill_count) ::kill(::getpid(), SIGKILL);
    };
  const ckpt::SaveResult res = a.background ? ckpt::begin_save(std::move(r), comm).finish()
                                            : ckpt::save_checkpoint(std::move(r), comm);
  if (comm.rank() == 0)
    std::printf("saved %s: %lld bytes\n", res.path.c_str(), static_cast<long long>(res.bytes));
  return 0;
}

int check(const Args& a, ckpt::Collective& comm) {
  const testing::TensorList tensors = model_tensors(a.model);
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(a.dir);
  if (c.step() != a.step) {
    std::fprintf(stderr, "rank %d: %s is step %lld, expected %lld\n", comm.rank(), c.path().c_str(),
                 static_cast<long long>(c.step()), static_cast<long long>(a.step));
    return 1;
  }
  c.verify();
  // This world's share, at another alignment than the writer's: the ranges differ from the saved slices.
  const FlatLayout layout = testing::flat_layout(tensors, 16);
  int64_t wrong = 0;
  for (const ckpt::StateGroup& g :
       testing::rank_state(tensors, layout, comm.size(), comm.rank(), 0, testing::all_groups())) {
    const std::vector<ckpt::ShardSlice> slices = testing::blank_like(g.slices);
    c.read_slices(g.name, slices);
    for (const ckpt::ShardSlice& s : slices) wrong += testing::count_wrong(s, tensors, a.step, g.name);
  }
  const bool scalars_ok =
      c.scalars() == testing::global_scalars(a.step) &&
      c.rank_scalars(c.world_size() - 1) == testing::rank_scalars(a.step, c.world_size() - 1);
  const int64_t any = comm.all_reduce_max(wrong + (scalars_ok ? 0 : 1));
  if (comm.rank() == 0)
    std::printf("%s: step %lld, saved at %d ranks, read at %d: %s\n", c.path().c_str(),
                static_cast<long long>(c.step()), c.world_size(), comm.size(), any ? "WRONG VALUES" : "ok");
  return any ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  cz::testing::MpiCollective comm;
  Args a;
  if (argc < 4) {
    std::fprintf(stderr, "usage: checkpoint_driver save|check DIR STEP [options]\n");
    return 2;
  }
  a.mode = argv[1];
  a.dir = argv[2];
  a.step = std::stoll(argv[3]);
  int i = 4;
  for (; i + 1 < argc && argv[i][0] != '-'; i += 2) a.more.emplace_back(argv[i], std::stoll(argv[i + 1]));
  for (; i < argc; ++i) {
    const std::string k = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (k == "--background") {
      a.background = true;
      continue;
    }
    ++i;
    if (k == "--model")
      a.model = v;
    else if (k == "--keep")
      a.keep = std::stoll(v);
    else if (k == "--kill-at")
      a.kill_at = v;
    else if (k == "--kill-rank")
      a.kill_rank = std::stoi(v);
    else if (k == "--kill-count")
      a.kill_count = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  int rc = 0;
  try {
    if (a.mode == "save") {
      rc = save(a, comm);
    } else {
      rc = check(a, comm);
      for (const auto& [dir, step] : a.more) {
        Args b = a;
        b.dir = dir;
        b.step = step;
        rc = std::max(rc, check(b, comm));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), e.what());
    rc = 1;
  }
  // Every rank has the same outcome for collective errors; a local one (check) is combined here.
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
