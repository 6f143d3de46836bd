// Saving a sharded checkpoint (io/checkpoint/checkpoint.h). Note [Checkpoint commit protocol]:
//   1. begin: rank 0 clears leftovers of interrupted saves and creates dir/.tmp-step_N; all ranks learn
//      whether it could (broadcast). Every rank sends its slice table (one broadcast per rank) and rank 0
//      checks that the slices tile every tensor exactly once;
//   2. every rank writes rank_<r>.h5 into the folder (temp name, fsync, rename), on a background thread for
//      begin_save; rank 0 then starts checkpoint.h5 (scalars, the virtual datasets: the slow part of it);
//   3. finish(): the ranks agree that all files are written (all-reduce; the lowest failing rank's reason is
//      broadcast, and everyone throws) and send rank 0 their file sizes;
//   4. rank 0 adds the manifest to checkpoint.h5, syncs it, renames .tmp-step_N to step_N, syncs dir,
//      rewrites `latest` (temp file, fsync, rename, sync dir), and only then prunes older checkpoints; its
//      outcome is broadcast.
// A process killed anywhere before the rename leaves only a .tmp- folder, which no reader looks at; after
// it, step_N is complete. So the previous checkpoint stays intact until a newer one is complete.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "io/checkpoint/checkpoint.h"
#include "io/checkpoint/checkpoint_layout.h"
#include "io/log/output_paths.h"

namespace cz::ckpt {

using detail::rank_file_name;
using nlohmann::json;

struct PendingSave::State {
  SaveRequest request;
  Collective* comm = nullptr;
  bool background = false;
  std::string temp_dir, final_dir;
  std::thread writer;
  std::thread cleaner;  // rank 0, background saves: removes the pruned checkpoints' files
  std::atomic<bool> done{false};
  bool finished = false;
  bool published = false;                    // rank 0: step_N is visible
  std::vector<std::string> datasets;         // the rank file's dataset for each non-empty slice, in order
  std::optional<detail::Manifest> manifest;  // rank 0, once the tables tile every tensor
  std::unique_ptr<h5::File> index;           // rank 0: checkpoint.h5 until it is committed
  // Set by the writer before `done`.
  std::string error;
  int64_t rank_bytes = 0;
  double write_seconds = 0;
  double prune_seconds = 0;

  void phase(const char* name) const {
    if (request.on_phase) request.on_phase(name);
  }
  ~State() {
    if (writer.joinable()) writer.join();
    if (cleaner.joinable()) cleaner.join();
  }
};

namespace {

// With the default action, exceeding the file-size limit (ulimit -f) kills the process with SIGXFSZ before
// the write can fail; ignored, the write fails with EFBIG and the save reports it. A handler the program
// installed itself is left alone.
void ignore_sigxfsz() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGXFSZ, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
      ::signal(SIGXFSZ, SIG_IGN);
  });
}

// What is wrong with this rank's part of the request; empty when nothing is.
std::string bad_request(const SaveRequest& r, int rank) {
  if (r.step < 0) return fmt::format("step {} is negative", r.step);
  if (r.stage < 0 || r.stage > 3) return fmt::format("stage {} is not 0..3", r.stage);
  std::set<std::string> groups;
  for (const StateGroup& g : r.groups) {
    if (std::string bad = detail::bad_name(g.name, "group"); !bad.empty()) return bad;
    if (g.name == "state" || g.name == "manifest") return fmt::format("group name '{}' is reserved", g.name);
    if (!groups.insert(g.name).second) return fmt::format("group '{}' is listed twice", g.name);
    for (const ShardSlice& s : g.slices) {
      const std::string where =
          fmt::format("group '{}', slice '{}' [{}, {})", g.name, s.name, s.begin, s.begin + s.numel);
      if (std::string bad = detail::bad_name(s.name, "tensor"); !bad.empty()) return where + ": " + bad;
      if (std::any_of(s.shape.begin(), s.shape.end(), [](int64_t d) { return d < 0; }) || s.begin < 0 ||
          s.numel < 0 || s.begin > shape_numel(s.shape) - s.numel)
        return fmt::format("{}: outside a tensor of shape {}", where, shape_str(s.shape));
      if (!s.local.defined() || s.local.dtype() != DType::f32 || !s.local.is_contiguous() ||
          s.local.numel() != s.numel)
        return fmt::format("{}: local must be a contiguous f32 tensor of {} elements; it is {}", where,
                           s.numel, s.local.defined() ? s.local.str() : "undefined");
    }
  }
  std::set<std::string> tensors;
  for (const TensorInfo& t : r.tensors) {
    if (std::string bad = detail::bad_name(t.name, "tensor"); !bad.empty()) return bad;
    if (std::any_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d < 0; }))
      return fmt::format("tensor '{}' has shape {}", t.name, shape_str(t.shape));
    if (!tensors.insert(t.name).second) return fmt::format("tensor '{}' is listed twice", t.name);
  }
  if (std::string bad = detail::bad_scalar_names(r.rank_scalars); !bad.empty()) return bad;
  if (rank == 0)
    if (std::string bad = detail::bad_scalar_names(r.scalars); !bad.empty()) return bad;
  return "";
}

// Copies every slice into one host buffer (page-locked when a slice lives on a GPU, so the copies run at
// full speed) and points the slices at it, so that training may change the originals while the writer runs.
void copy_to_host(std::vector<StateGroup>& groups) {
  int64_t total = 0;
  bool device = false;
  for (const StateGroup& g : groups)
    for (const ShardSlice& s : g.slices) {
      total += s.numel;
      device = device || !s.local.is_cpu();
    }
  const Tensor buffer = device ? empty_pinned({total}) : empty({total});
  int64_t offset = 0;
  for (StateGroup& g : groups)
    for (ShardSlice& s : g.slices) {
      Tensor host = buffer.narrow(0, offset, s.numel);
      host.copy_(s.local.view({s.numel}));
      s.local = host;
      offset += s.numel;
    }
}

// Bytes a save of `slices` slices holding `elements` values takes: the data, HDF5's chunk index, object
// headers and checksums (measured at ~3 KiB per dataset), and the index file's virtual dataset for it (~1
// KiB), with room to spare.
int64_t bytes_needed(int64_t elements, int64_t slices) {
  const int64_t data = elements * int64_t(sizeof(float));
  return data + data / 64 + slices * (int64_t(6) << 10) + (int64_t(64) << 10);
}

// Why there is no room for this rank's part of the save (rank 0: the whole checkpoint, whose files usually
// share one file system), empty when there is.
std::string space_problem(const PendingSave::State& s, const std::vector<json>& tables) {
  int64_t elements = 0, slices = 0;
  if (s.comm->rank() == 0) {
    for (const json& t : tables)
      if (t.contains("slices"))
        for (const json& sl : t.at("slices")) elements += sl.at("numel").get<int64_t>(), ++slices;
  } else {
    for (const StateGroup& g : s.request.groups)
      for (const ShardSlice& slice : g.slices) elements += slice.numel, ++slices;
  }
  const int64_t need = bytes_needed(elements, slices), have = free_bytes(s.request.dir);
  if (have < 0 || have >= need) return "";
  return fmt::format(
      "it needs about {:.1f} MB{} and {} has {:.1f} MB free; free some space or keep fewer checkpoints "
      "(--keep-checkpoints)",
      double(need) / 1e6, s.comm->rank() == 0 ? "" : " for this rank's file", s.request.dir,
      double(have) / 1e6);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This rank's part of the manifest: its file, scalar names and slices, and the dataset each slice goes to
// (a second slice of one tensor gets "<group>/<name>#1").
json slice_table(PendingSave::State& s) {
  json slices = json::array();
  std::map<std::string, int> uses;
  for (const StateGroup& g : s.request.groups)
    for (const ShardSlice& slice : g.slices) {
      if (slice.numel == 0) continue;
      std::string key = g.name + "/" + slice.name;
      if (const int n = uses[key]++; n > 0) key += fmt::format("#{}", n);
      slices.push_back({{"group", g.name},
                        {"name", slice.name},
                        {"shape", slice.shape},
                        {"begin", slice.begin},
                        {"numel", slice.numel},
                        {"dataset", key}});
      s.datasets.push_back(std::move(key));
    }
  const detail::ScalarNames names = detail::names_of(s.request.rank_scalars);
  return {
      {"file", rank_file_name(s.comm->rank())},
      {"scalars",
       {{"ints", names.ints}, {"floats", names.floats}, {"strings", names.strings}, {"bytes", names.bytes}}},
      {"slices", std::move(slices)}};
}

// Rank 0: checkpoint.h5 but for its manifest, which needs the rank files' sizes (finish() adds it).
void start_index(PendingSave::State& s) {
  const detail::Manifest& m = *s.manifest;
  s.index =
      std::make_unique<h5::File>(h5::File::create(s.temp_dir + "/" + kIndexFile, {.modern_format = true}));
  h5::File& index = *s.index;
  index.set_attr("format", std::string(kFormat));
  index.set_attr("version", kVersion);
  index.set_attr("step", m.step);
  index.set_attr("world_size", int64_t(m.world_size));
  index.set_attr("stage", int64_t(m.stage));
  detail::write_scalars(index, s.request.scalars);
  for (const detail::GroupEntry& g : m.groups)
    for (const detail::TensorEntry& t : g.tensors) {
      std::vector<h5::VirtualSource> sources;
      for (const detail::SliceEntry& sl : t.slices)
        sources.push_back({rank_file_name(sl.rank), sl.dataset, sl.begin, sl.numel});
      // NaN where a rank file is missing, so that h5py shows a damaged checkpoint instead of zeros.
      index.write_virtual(g.name + "/" + t.name, t.shape, sources, std::numeric_limits<float>::quiet_NaN());
    }
}

void write_rank_file(PendingSave::State& s) {
  const double start = now();
  const int rank = s.comm->rank();
  try {
    const std::string path = s.temp_dir + "/" + rank_file_name(rank);
    h5::File file = h5::File::create(path, {.modern_format = true});
    file.set_attr("format", std::string(kFormat));
    file.set_attr("version", kVersion);
    file.set_attr("step", s.request.step);
    file.set_attr("rank", int64_t(rank));
    detail::write_scalars(file, s.request.rank_scalars);
    size_t k = 0;
    for (const StateGroup& g : s.request.groups)
      for (const ShardSlice& slice : g.slices) {
        if (slice.numel == 0) continue;
        const Tensor host = slice.local.is_cpu() ? slice.local : slice.local.cpu();
        file.write(s.datasets[k++], host.view({slice.numel}), {.checksum = true});
        s.phase("slice");
      }
    file.commit();
    s.rank_bytes = detail::file_bytes(path);
    s.write_seconds = now() - start;
    s.phase("rank_file");
    if (s.manifest) start_index(s);
  } catch (const std::exception& e) {
    s.error = e.what();
    s.write_seconds = now() - start;
  }
  s.done = true;
}

// Rank 0's manifest from every rank's table; IoError when the slices do not tile the tensors.
detail::Manifest build_manifest(const PendingSave::State& s, const std::vector<json>& tables) {
  detail::Manifest m;
  m.step = s.request.step;
  m.world_size = int(tables.size());
  m.stage = s.request.stage;
  m.scalars = detail::names_of(s.request.scalars);
  std::map<std::string, size_t> group_index;
  std::map<std::pair<size_t, std::string>, size_t> tensor_index;
  std::vector<std::string> problems;
  const std::vector<TensorInfo>& declared = s.request.tensors;
  auto add_group = [&](const std::string& group) {
    auto [g, added] = group_index.try_emplace(group, m.groups.size());
    if (!added) return g->second;
    m.groups.push_back({group, {}});
    for (const TensorInfo& t : declared) {  // so that a tensor nobody wrote shows up as uncovered
      tensor_index[{g->second, t.name}] = m.groups.back().tensors.size();
      m.groups.back().tensors.push_back({t.name, t.shape, {}});
    }
    return g->second;
  };
  for (const StateGroup& g : s.request.groups) add_group(g.name);  // rank 0's order first
  for (size_t r = 0; r < tables.size(); ++r) {
    const json& t = tables[r];
    const json& sn = t.at("scalars");
    m.ranks.push_back({t.at("file").get<std::string>(),
                       0,  // known once the file is written
                       {sn.at("ints"), sn.at("floats"), sn.at("strings"), sn.at("bytes")}});
    for (const json& sl : t.at("slices")) {
      const std::string group = sl.at("group"), name = sl.at("name");
      const Shape shape = sl.at("shape").get<Shape>();
      const size_t gi = add_group(group);
      auto [ti, new_tensor] = tensor_index.try_emplace({gi, name}, m.groups[gi].tensors.size());
      auto& tensors = m.groups[gi].tensors;
      if (new_tensor) {
        if (!declared.empty()) {
          problems.push_back(
              fmt::format("{}/{}: rank {} has a slice of it, but it is not among the {} tensors "
                          "listed",
                          group, name, r, declared.size()));
          tensor_index.erase(ti);
          continue;
        }
        tensors.push_back({name, shape, {}});
      }
      detail::TensorEntry& tensor = tensors[ti->second];
      if (tensor.shape != shape)
        problems.push_back(
            fmt::format("{}/{}: rank {} has shape {}, but {} was {}", group, name, r, shape_str(shape),
                        declared.empty() ? "an earlier rank's" : "the listed", shape_str(tensor.shape)));
      tensor.slices.push_back({int(r), sl.at("begin").get<int64_t>(), sl.at("numel").get<int64_t>(),
                               sl.at("dataset").get<std::string>()});
    }
  }
  if (problems.empty()) problems = detail::coverage_problems(m);
  CZ_CHECK_IO(problems.empty(), "the ranks' slices do not cover every tensor exactly once:\n  {}",
              fmt::join(problems, "\n  "));
  return m;
}

// Rank 0, step 4 of the protocol, with every rank's file size. Returns the bytes of the index file.
int64_t commit(PendingSave::State& s, const std::vector<int64_t>& sizes) {
  detail::Manifest& m = *s.manifest;
  for (size_t r = 0; r < sizes.size(); ++r) m.ranks[r].bytes = sizes[r];
  const std::string text = detail::to_json(m).dump();
  s.index->write("manifest",
                 from_vector<uint8_t>(std::vector<uint8_t>(text.begin(), text.end()), {int64_t(text.size())}),
                 {.checksum = true});
  s.index->commit();
  s.index.reset();
  s.phase("index");
  detail::sync_dir(s.temp_dir);
  detail::publish_dir(s.temp_dir, s.final_dir);
  s.published = true;
  detail::sync_dir(s.request.dir);
  s.phase("renamed");
  detail::write_latest(s.request.dir, detail::step_dir_name(s.request.step));
  s.phase("latest");
  // Note [Pruning off the critical path]: older checkpoints are renamed out of sight at once; deleting their
  // files (a tenth of a second for a ConvNeXt-T one on this machine's ext4) happens, for a background
  // save, on a thread that the PendingSave joins when it is destroyed (normally at the next begin_save).
  const double prune_start = now();
  std::vector<std::string> doomed = detail::prune(s.request.dir, s.request.step, s.request.keep);
  if (s.background)
    s.cleaner = std::thread([doomed = std::move(doomed)] {
      for (const std::string& d : doomed) detail::remove_tree_quietly(d);
    });
  else
    for (const std::string& d : doomed) detail::remove_tree_quietly(d);
  s.prune_seconds = now() - prune_start;
  s.phase("pruned");
  return detail::file_bytes(s.final_dir + "/" + kIndexFile);
}

PendingSave start(SaveRequest request, Collective& comm, bool background) {
  ignore_sigxfsz();
  auto s = std::make_unique<PendingSave::State>();
  s->comm = &comm;
  s->background = background;
  request.dir = detail::trim_slashes(request.dir);
  s->temp_dir = request.dir + "/" + detail::temp_dir_name(request.step);
  s->final_dir = request.dir + "/" + detail::step_dir_name(request.step);
  s->request = std::move(request);
  std::string status;
  if (comm.rank() == 0) {
    try {
      CZ_CHECK_IO(!s->request.dir.empty(), "checkpoint folder is empty");
      detail::make_dirs(s->request.dir);
      detail::remove_leftovers(s->request.dir);
      detail::make_dirs(s->temp_dir);
    } catch (const std::exception& e) {
      status = e.what();
    }
  }
  status = comm.broadcast(status, 0);
  CZ_CHECK_IO(status.empty(), "checkpoint {} not saved: {}", s->final_dir, status);
  s->phase("prepared");
  s->error = bad_request(s->request, comm.rank());
  if (!s->error.empty()) s->error = fmt::format("save_checkpoint: {}", s->error);

  // Rank 0 learns every rank's slices now, so that it can build the index while the data is written.
  const json table = s->error.empty() ? slice_table(*s) : json{{"bad", true}};
  std::vector<json> tables;
  bool complete = true;
  for (int r = 0; r < comm.size(); ++r) {
    const std::string t = comm.broadcast(r == comm.rank() ? table.dump() : std::string(), r);
    if (comm.rank() != 0) continue;
    tables.push_back(json::parse(t));
    complete = complete && !tables.back().contains("bad");
  }
  if (comm.rank() == 0 && complete && s->error.empty()) {
    try {
      s->manifest = build_manifest(*s, tables);
    } catch (const std::exception& e) {
      s->error = e.what();
    }
  }

  // Refuse a save that cannot fit before anything is written, rather than fail half-way.
  const std::string space = s->error.empty() ? space_problem(*s, tables) : std::string();
  if (const int64_t failing = comm.all_reduce_max(space.empty() ? 0 : comm.size() - comm.rank())) {
    const int root = int(comm.size() - failing);
    const std::string reason = comm.broadcast(space, root);
    if (comm.rank() == 0) detail::remove_tree_quietly(s->temp_dir);
    throw IoError(fmt::format("checkpoint {} not saved: rank {}: {}", s->final_dir, root, reason));
  }

  if (!s->error.empty()) {
    s->done = true;
  } else if (background) {
    try {
      copy_to_host(s->request.groups);
      s->writer = std::thread(write_rank_file, std::ref(*s));
    } catch (const std::exception& e) {
      s->error = fmt::format("copying the slices to host memory: {}", e.what());
      s->done = true;
    }
  } else {
    write_rank_file(*s);
  }
  return PendingSave(std::move(s));
}

}  // namespace

std::vector<ShardSlice> slices_of_flat_range(const FlatLayout& layout, int64_t begin, int64_t end,
                                             const Tensor& shard) {
  CZ_CHECK(
      0 <= begin && begin <= end && end <= layout.numel && shard.defined() && shard.numel() == end - begin,
      "slices_of_flat_range: [{}, {}) of a flat buffer of {} with a shard of {} elements", begin, end,
      layout.numel, shard.defined() ? shard.numel() : 0);
  std::vector<ShardSlice> out;
  const Tensor flat = shard.view({end - begin});
  for (const FlatSegment& seg : layout.segments) {
    const int64_t lo = std::max(begin, seg.offset), hi = std::min(end, seg.offset + seg.numel);
    if (lo >= hi) continue;
    out.push_back({seg.name, seg.shape, lo - seg.offset, hi - lo, flat.narrow(0, lo - begin, hi - lo)});
  }
  return out;
}

PendingSave::PendingSave(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingSave::PendingSave(PendingSave&&) noexcept = default;
PendingSave& PendingSave::operator=(PendingSave&&) noexcept = default;
PendingSave::~PendingSave() = default;

bool PendingSave::written() const {
  return state_->done.load();
}

SaveResult PendingSave::finish() {
  State& s = *state_;
  CZ_ASSERT(!s.finished, "PendingSave::finish called twice");
  s.finished = true;
  if (s.writer.joinable()) s.writer.join();
  Collective& comm = *s.comm;
  const int rank = comm.rank(), size = comm.size();

  // Step 3: agree, then gather the file sizes.
  const int64_t failing = comm.all_reduce_max(s.error.empty() ? 0 : size - rank);
  if (failing > 0) {
    const int root = int(size - failing);
    const std::string reason = comm.broadcast(s.error, root);
    s.index.reset();
    if (rank == 0) detail::remove_tree_quietly(s.temp_dir);
    throw IoError(fmt::format("checkpoint {} not saved: rank {}: {}", s.final_dir, root, reason));
  }
  s.phase("agreed");
  std::vector<int64_t> sizes;
  for (int r = 0; r < size; ++r) {
    const std::string b = comm.broadcast(r == rank ? std::to_string(s.rank_bytes) : std::string(), r);
    if (rank == 0) sizes.push_back(std::stoll(b));
  }

  // Step 4.
  json outcome = {{"error", ""}, {"bytes", 0}, {"prune_seconds", 0.0}};
  if (rank == 0) {
    try {
      int64_t bytes = commit(s, sizes);
      for (const int64_t b : sizes) bytes += b;
      outcome["bytes"] = bytes;
      outcome["prune_seconds"] = s.prune_seconds;
    } catch (const std::exception& e) {
      outcome["error"] = fmt::format("{}: {}", s.published ? "saved, but then" : "not saved", e.what());
      s.index.reset();
      if (!s.published) detail::remove_tree_quietly(s.temp_dir);
    }
  }
  outcome = json::parse(comm.broadcast(outcome.dump(), 0));
  const std::string error = outcome.at("error");
  CZ_CHECK_IO(error.empty(), "checkpoint {} {}", s.final_dir, error);
  return {s.final_dir, outcome.at("bytes").get<int64_t>(), s.rank_bytes, s.write_seconds,
          outcome.at("prune_seconds").get<double>()};
}

PendingSave begin_save(SaveRequest request, Collective& comm) {
  return start(std::move(request), comm, true);
}

SaveResult save_checkpoint(SaveRequest request, Collective& comm) {
  return start(std::move(request), comm, false).finish();
}

}  // namespace cz::ckpt
