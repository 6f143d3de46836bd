// Opening and reading a sharded checkpoint (io/checkpoint/checkpoint.h): ranges of tensors straight from the
// rank files that hold them, whatever world size wrote them; export of one group as a weight file.
#include <algorithm>
#include <filesystem>
#include <map>

#include "io/checkpoint/checkpoint.h"
#include "io/checkpoint/checkpoint_layout.h"
#include "io/checkpoint/weights.h"
#include "tensor/autograd/engine.h"

namespace cz::ckpt {

namespace {
// Host buffer for reads into device memory and for verify(): 1 Mi elements (4 MiB).
constexpr int64_t kStagingElems = int64_t{1} << 20;
// Rank files kept open at once (least recently used closed first): a checkpoint of a thousand ranks read by
// one process (an export) must not run out of file descriptors.
constexpr int kMaxOpenRankFiles = 64;

}  // namespace

struct Checkpoint::Impl {
  std::string path;
  h5::File index;
  detail::Manifest manifest;
  Scalars scalars;
  std::map<std::string, size_t> group_index;
  std::vector<std::vector<TensorInfo>> infos;               // per group
  std::vector<std::map<std::string, size_t>> tensor_index;  // per group
  mutable std::vector<std::unique_ptr<h5::File>> rank_files;
  mutable std::vector<int64_t> last_use;  // per rank file, for closing the least recently used
  // Per rank file: walked by the probe (Note [Probing HDF5 files]) when first opened; not again on reopening.
  mutable std::vector<bool> probed;
  mutable int64_t uses = 0;
  mutable int open_files = 0;

  explicit Impl(h5::File file) : index(std::move(file)) {}

  size_t group(const std::string& g) const {
    auto it = group_index.find(g);
    if (it != group_index.end()) return it->second;
    std::vector<std::string> names;
    for (const auto& e : manifest.groups) names.push_back(e.name);
    throw IoError(fmt::format("{}: no group '{}' (it has: {})", path, g, fmt::join(names, ", ")));
  }
  const detail::TensorEntry& tensor(const std::string& g, const std::string& name) const {
    const size_t gi = group(g);
    auto it = tensor_index[gi].find(name);
    CZ_CHECK_IO(it != tensor_index[gi].end(), "{}: no tensor '{}' in group '{}'", path, name, g);
    return manifest.groups[gi].tensors[it->second];
  }
  const h5::File& rank_file(int rank) const {
    std::unique_ptr<h5::File>& f = rank_files[size_t(rank)];
    last_use[size_t(rank)] = ++uses;
    if (!f) {
      if (open_files >= kMaxOpenRankFiles) {
        size_t oldest = 0;
        for (size_t r = 0; r < rank_files.size(); ++r)
          if (rank_files[r] && (!rank_files[oldest] || last_use[r] < last_use[oldest])) oldest = r;
        rank_files[oldest].reset();
        --open_files;
      }
      // Probed here, when a read first needs the file, rather than all at open: a reader at another world
      // size touches only the rank files holding its ranges.
      auto file =
          std::make_unique<h5::File>(h5::File::open(path + "/" + manifest.ranks[size_t(rank)].file,
                                                    {.vds_source = true, .probe = !probed[size_t(rank)]}));
      probed[size_t(rank)] = true;
      CZ_CHECK_IO(file->string_attr("format") == kFormat && file->int_attr("rank") == rank &&
                      file->int_attr("step") == manifest.step,
                  "{}: not rank {}'s file of step {} (format '{}', rank {}, step {})", file->path(), rank,
                  manifest.step, file->string_attr("format"), file->int_attr("rank"), file->int_attr("step"));
      f = std::move(file);
      ++open_files;
    }
    return *f;
  }
};

std::string resolve_checkpoint(const std::string& given) {
  const std::string path = detail::trim_slashes(given);
  if (detail::is_file(path + "/" + kIndexFile)) return path;
  CZ_CHECK_IO(detail::is_dir(path), "{}: no such checkpoint folder", path);
  const std::optional<std::string> latest = detail::read_latest(path);
  if (latest && detail::is_file(path + "/" + *latest + "/" + kIndexFile)) return path + "/" + *latest;
  const auto found = detail::list_checkpoints(path);
  if (!found.empty()) return found.back().second;
  bool partial = false;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path, ec))
    partial = partial || e.path().filename().string().rfind(".tmp-step_", 0) == 0;
  throw IoError(
      fmt::format("{}: no checkpoint here (no step_N/{}{}{})", path, kIndexFile,
                  latest ? fmt::format("; 'latest' names {}, which is incomplete or gone", *latest) : "",
                  partial ? "; only an interrupted save (.tmp-step_N), which is never loaded" : ""));
}

Checkpoint Checkpoint::open(const std::string& given) {
  const std::string path = resolve_checkpoint(given);
  auto impl = std::make_unique<Impl>(h5::File::open(path + "/" + kIndexFile));
  impl->path = path;
  const h5::File& index = impl->index;
  const std::string& file = index.path();
  std::string format;
  try {
    format = index.string_attr("format");
  } catch (const IoError&) {
    throw IoError(fmt::format("{}: not a convnext_zero checkpoint (no 'format' attribute)", file));
  }
  CZ_CHECK_IO(format == kFormat, "{}: format is '{}', not a convnext_zero checkpoint ('{}')", file, format,
              kFormat);
  const int64_t version = index.int_attr("version");
  CZ_CHECK_IO(version == kVersion, "{}: checkpoint format version {}; this build reads version {}", file,
              version, kVersion);

  const std::vector<int64_t> bytes = index.read("manifest").to_vector<int64_t>();
  const std::string text(bytes.begin(), bytes.end());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("{}: dataset 'manifest' is not valid JSON: {}", file, e.what()));
  }
  detail::Manifest& m = impl->manifest = detail::manifest_from_json(j, file + ": dataset 'manifest'");
  CZ_CHECK_IO(m.step == index.int_attr("step") && m.world_size == index.int_attr("world_size") &&
                  m.stage == index.int_attr("stage"),
              "{}: attributes step/world_size/stage disagree with the manifest", file);
  const std::vector<std::string> problems = detail::coverage_problems(m);
  CZ_CHECK_IO(problems.empty(), "{}: the manifest does not cover every tensor exactly once:\n  {}", file,
              fmt::join(problems, "\n  "));
  for (const detail::RankEntry& r : m.ranks) {
    const std::string rank_path = path + "/" + r.file;
    const int64_t size = detail::file_bytes(rank_path);
    CZ_CHECK_IO(size >= 0, "{}: missing (the checkpoint has {} rank files)", rank_path, m.world_size);
    CZ_CHECK_IO(size == r.bytes, "{}: {} bytes, but {} were written: truncated or overwritten", rank_path,
                size, r.bytes);
  }
  impl->rank_files.resize(m.ranks.size());
  impl->last_use.resize(m.ranks.size());
  impl->probed.resize(m.ranks.size());
  impl->scalars = detail::read_scalars(index, m.scalars);
  for (const detail::GroupEntry& g : m.groups) {
    impl->group_index[g.name] = impl->infos.size();
    auto& infos = impl->infos.emplace_back();
    auto& by_name = impl->tensor_index.emplace_back();
    for (const detail::TensorEntry& t : g.tensors) {
      CZ_CHECK_IO(by_name.emplace(t.name, infos.size()).second, "{}: tensor {}/{} listed twice", file, g.name,
                  t.name);
      infos.push_back({t.name, t.shape});
    }
  }
  return Checkpoint(std::move(impl));
}

Checkpoint::Checkpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

const std::string& Checkpoint::path() const {
  return impl_->path;
}
int64_t Checkpoint::step() const {
  return impl_->manifest.step;
}
int Checkpoint::world_size() const {
  return impl_->manifest.world_size;
}
int Checkpoint::stage() const {
  return impl_->manifest.stage;
}
const Scalars& Checkpoint::scalars() const {
  return impl_->scalars;
}

Scalars Checkpoint::rank_scalars(int rank) const {
  CZ_CHECK(rank >= 0 && rank < world_size(), "{}: rank {} asked for; the checkpoint has ranks 0..{}", path(),
           rank, world_size() - 1);
  return detail::read_scalars(impl_->rank_file(rank), impl_->manifest.ranks[size_t(rank)].scalars);
}

std::vector<std::string> Checkpoint::groups() const {
  std::vector<std::string> names;
  for (const auto& g : impl_->manifest.groups) names.push_back(g.name);
  return names;
}

bool Checkpoint::has(const std::string& group, const std::string& name) const {
  auto it = impl_->group_index.find(group);
  return it != impl_->group_index.end() && impl_->tensor_index[it->second].count(name);
}

const std::vector<TensorInfo>& Checkpoint::tensors(const std::string& group) const {
  return impl_->infos[impl_->group(group)];
}

const Shape& Checkpoint::shape(const std::string& group, const std::string& name) const {
  return impl_->tensor(group, name).shape;
}

void Checkpoint::read(const std::string& group, const std::string& name, int64_t begin,
                      const Tensor& out) const {
  const detail::TensorEntry& t = impl_->tensor(group, name);
  const int64_t numel = shape_numel(t.shape);
  CZ_CHECK(out.defined() && out.dtype() == DType::f32 && out.is_contiguous(),
           "Checkpoint::read {}/{}: out must be a contiguous f32 tensor; it is {}", group, name,
           out.defined() ? out.str() : "undefined");
  const int64_t n = out.numel(), end = begin + n;
  CZ_CHECK(begin >= 0 && begin <= numel && n <= numel - begin,
           "{}: {}/{} has {} elements {}; elements [{}, {}) were asked for", path(), group, name, numel,
           shape_str(t.shape), begin, end);
  NoGradGuard no_grad;  // `out` may be a view of a parameter
  const Tensor flat = out.view({n});
  Tensor staging;
  if (!out.is_cpu()) staging = empty_pinned({std::min(n, kStagingElems)});
  // Slices are sorted by begin and tile [0, numel): start at the one holding `begin`.
  auto it = std::upper_bound(t.slices.begin(), t.slices.end(), begin,
                             [](int64_t b, const detail::SliceEntry& s) { return b < s.begin; });
  if (it != t.slices.begin()) --it;
  for (; it != t.slices.end() && it->begin < end; ++it) {
    const int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->begin + it->numel);
    if (lo >= hi) continue;
    const h5::File& file = impl_->rank_file(it->rank);
    if (out.is_cpu()) {
      file.read_range(it->dataset, lo - it->begin, flat.narrow(0, lo - begin, hi - lo));
      continue;
    }
    for (int64_t at = lo; at < hi; at += kStagingElems) {
      const int64_t len = std::min(kStagingElems, hi - at);
      const Tensor host = staging.narrow(0, 0, len);
      file.read_range(it->dataset, at - it->begin, host);
      Tensor(flat.narrow(0, at - begin, len)).copy_(host);
    }
  }
}

void Checkpoint::read_slices(const std::string& group, const std::vector<ShardSlice>& slices) const {
  for (const ShardSlice& s : slices) {
    const Shape& shape = impl_->tensor(group, s.name).shape;
    CZ_CHECK_IO(shape == s.shape, "{}: {}/{} has shape {}, but the slice to fill is of a tensor of shape {}",
                path(), group, s.name, shape_str(shape), shape_str(s.shape));
    CZ_CHECK(s.local.defined() && s.local.numel() == s.numel,
             "Checkpoint::read_slices {}/{}: local has {} elements, numel says {}", group, s.name,
             s.local.defined() ? s.local.numel() : 0, s.numel);
    read(group, s.name, s.begin, s.local);
  }
}

Tensor Checkpoint::read_tensor(const std::string& group, const std::string& name) const {
  Tensor out = empty(shape(group, name));
  read(group, name, 0, out);
  return out;
}

void Checkpoint::verify() const {
  const Tensor buffer = empty({kStagingElems});
  for (const detail::GroupEntry& g : impl_->manifest.groups)
    for (const detail::TensorEntry& t : g.tensors)
      for (const detail::SliceEntry& s : t.slices) {
        const h5::File& file = impl_->rank_file(s.rank);
        const h5::DatasetInfo info = file.info(s.dataset);
        CZ_CHECK_IO(info.shape == Shape{s.numel} && info.dtype == DType::f32,
                    "{}: dataset '{}' is {} {}, the manifest says f32 ({})", file.path(), s.dataset,
                    dtype_name(info.dtype), shape_str(info.shape), s.numel);
        for (int64_t at = 0; at < s.numel; at += kStagingElems)
          file.read_range(s.dataset, at, buffer.narrow(0, 0, std::min(kStagingElems, s.numel - at)));
      }
  for (int r = 0; r < world_size(); ++r) rank_scalars(r);
}

void export_weights(const Checkpoint& ckpt, const std::string& group, const std::string& path,
                    const WeightExportOptions& options) {
  WeightExportOptions opt = options;
  // The training set's class names, which the trainer records (Note [Class names]).
  const auto names = ckpt.scalars().strings.find("class_names");
  if (opt.class_names.empty() && names != ckpt.scalars().strings.end())
    opt.class_names = class_names_from_json(names->second, ckpt.path() + ": scalar 'class_names'");
  WeightFileWriter writer(path, opt);
  for (const TensorInfo& t : ckpt.tensors(group)) writer.add(t.name, ckpt.read_tensor(group, t.name));
  writer.commit();
}

}  // namespace cz::ckpt
