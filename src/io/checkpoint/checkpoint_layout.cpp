// The checkpoint manifest and folder operations (io/checkpoint/checkpoint_layout.h).
#include "io/checkpoint/checkpoint_layout.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

namespace cz::ckpt::detail {
namespace {

nlohmann::json names_json(const ScalarNames& n) {
  return {{"ints", n.ints}, {"floats", n.floats}, {"strings", n.strings}, {"bytes", n.bytes}};
}

ScalarNames names_from(const nlohmann::json& j) {
  return {j.at("ints").get<std::vector<std::string>>(), j.at("floats").get<std::vector<std::string>>(),
          j.at("strings").get<std::vector<std::string>>(), j.at("bytes").get<std::vector<std::string>>()};
}

const std::set<std::string>& reserved_attrs() {
  static const std::set<std::string> names = {"format", "version", "step", "world_size", "stage", "rank"};
  return names;
}

[[noreturn]] void fail_errno(const std::string& path, const std::string& what) {
  throw IoError(fmt::format("{}: {}: {}", path, what, std::strerror(errno)));
}

}  // namespace

nlohmann::json to_json(const Manifest& m) {
  nlohmann::json ranks = nlohmann::json::array(), groups = nlohmann::json::array();
  for (const RankEntry& r : m.ranks)
    ranks.push_back({{"file", r.file}, {"bytes", r.bytes}, {"scalars", names_json(r.scalars)}});
  for (const GroupEntry& g : m.groups) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const TensorEntry& t : g.tensors) {
      nlohmann::json slices = nlohmann::json::array();
      for (const SliceEntry& s : t.slices) slices.push_back({s.rank, s.begin, s.numel, s.dataset});
      tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"slices", std::move(slices)}});
    }
    groups.push_back({{"name", g.name}, {"tensors", std::move(tensors)}});
  }
  return {{"format", kFormat},          {"version", kVersion},        {"step", m.step},
          {"world_size", m.world_size}, {"stage", m.stage},           {"scalars", names_json(m.scalars)},
          {"ranks", std::move(ranks)},  {"groups", std::move(groups)}};
}

Manifest manifest_from_json(const nlohmann::json& j, const std::string& where) {
  try {
    CZ_CHECK_IO(j.at("format").get<std::string>() == kFormat, "{}: manifest format is '{}', expected '{}'",
                where, j.at("format").get<std::string>(), kFormat);
    Manifest m;
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.stage = j.at("stage").get<int>();
    m.scalars = names_from(j.at("scalars"));
    for (const auto& r : j.at("ranks"))
      m.ranks.push_back(
          {r.at("file").get<std::string>(), r.at("bytes").get<int64_t>(), names_from(r.at("scalars"))});
    for (const auto& g : j.at("groups")) {
      GroupEntry group{g.at("name").get<std::string>(), {}};
      for (const auto& t : g.at("tensors")) {
        TensorEntry tensor{t.at("name").get<std::string>(), t.at("shape").get<Shape>(), {}};
        for (const auto& s : t.at("slices"))
          tensor.slices.push_back({s.at(0).get<int>(), s.at(1).get<int64_t>(), s.at(2).get<int64_t>(),
                                   s.at(3).get<std::string>()});
        group.tensors.push_back(std::move(tensor));
      }
      m.groups.push_back(std::move(group));
    }
    CZ_CHECK_IO(m.world_size >= 1 && int64_t(m.ranks.size()) == m.world_size,
                "{}: manifest lists {} rank files for a world of {}", where, m.ranks.size(), m.world_size);
    for (const GroupEntry& g : m.groups)
      for (const TensorEntry& t : g.tensors)
        for (const SliceEntry& s : t.slices)
          CZ_CHECK_IO(s.rank >= 0 && s.rank < m.world_size,
                      "{}: manifest puts a slice of {}/{} on rank {} of {}", where, g.name, t.name, s.rank,
                      m.world_size);
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("{}: malformed manifest: {}", where, e.what()));
  }
}

std::vector<std::string> coverage_problems(Manifest& m) {
  constexpr size_t kMost = 12;
  std::vector<std::string> problems;
  size_t more = 0;
  auto report = [&](std::string p) {
    if (problems.size() < kMost)
      problems.push_back(std::move(p));
    else
      ++more;
  };
  for (GroupEntry& g : m.groups)
    for (TensorEntry& t : g.tensors) {
      const std::string name = g.name + "/" + t.name;
      if (std::any_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d < 0; })) {
        report(fmt::format("{}: negative shape {}", name, shape_str(t.shape)));
        continue;
      }
      const int64_t numel = shape_numel(t.shape);
      std::sort(t.slices.begin(), t.slices.end(),
                [](const SliceEntry& a, const SliceEntry& b) { return a.begin < b.begin; });
      int64_t covered = 0;  // elements [0, covered) are in some slice
      int last_rank = -1;
      for (const SliceEntry& s : t.slices) {
        if (s.begin < 0 || s.numel <= 0 || s.begin > numel - s.numel) {
          report(fmt::format("{}: rank {} has elements [{}, {}) of a tensor of {} {}", name, s.rank, s.begin,
                             s.begin + s.numel, numel, shape_str(t.shape)));
          continue;
        }
        if (s.begin > covered)
          report(fmt::format("{}: elements [{}, {}) are in no rank's slice", name, covered, s.begin));
        else if (s.begin < covered)
          report(fmt::format("{}: elements [{}, {}) are in slices of ranks {} and {}", name, s.begin,
                             std::min(covered, s.begin + s.numel), last_rank, s.rank));
        covered = std::max(covered, s.begin + s.numel);
        last_rank = s.rank;
      }
      if (covered < numel)
        report(fmt::format("{}: elements [{}, {}) of {} are in no rank's slice", name, covered, numel,
                           shape_str(t.shape)));
    }
  if (more) problems.push_back(fmt::format("... and {} more", more));
  return problems;
}

std::string bad_name(const std::string& name, const char* what) {
  if (name.empty()) return fmt::format("{} name is empty", what);
  if (name.find('/') != std::string::npos || name == "." || name == "..")
    return fmt::format("{} name '{}' contains '/' or is '.'", what, name);
  return "";
}

std::string bad_scalar_names(const Scalars& s) {
  std::set<std::string> seen;
  auto check = [&](const std::string& name) -> std::string {
    if (std::string bad = bad_name(name, "scalar"); !bad.empty()) return bad;
    if (reserved_attrs().count(name)) return fmt::format("scalar name '{}' is reserved", name);
    if (!seen.insert(name).second) return fmt::format("scalar name '{}' is used for two kinds", name);
    return "";
  };
  const ScalarNames names = names_of(s);
  for (const auto* kind : {&names.ints, &names.floats, &names.strings, &names.bytes})
    for (const std::string& n : *kind)
      if (std::string bad = check(n); !bad.empty()) return bad;
  return "";
}

ScalarNames names_of(const Scalars& s) {
  ScalarNames n;
  for (const auto& [k, v] : s.ints) n.ints.push_back(k);
  for (const auto& [k, v] : s.floats) n.floats.push_back(k);
  for (const auto& [k, v] : s.strings) n.strings.push_back(k);
  for (const auto& [k, v] : s.bytes) n.bytes.push_back(k);
  return n;
}

void write_scalars(h5::File& file, const Scalars& s) {
  for (const auto& [k, v] : s.ints) file.set_attr(k, v);
  for (const auto& [k, v] : s.floats) file.set_attr(k, v);
  for (const auto& [k, v] : s.strings) file.set_attr(k, v);
  for (const auto& [k, v] : s.bytes)
    file.write("state/" + k, from_vector<uint8_t>(v, {int64_t(v.size())}), {.checksum = true});
}

Scalars read_scalars(const h5::File& file, const ScalarNames& names) {
  Scalars s;
  for (const std::string& k : names.ints) s.ints[k] = file.int_attr(k);
  for (const std::string& k : names.floats) s.floats[k] = file.double_attr(k);
  for (const std::string& k : names.strings) s.strings[k] = file.string_attr(k);
  for (const std::string& k : names.bytes) {
    const Tensor t = file.read("state/" + k);
    CZ_CHECK_IO(t.dim() == 1, "{}: dataset 'state/{}' is not 1-D", file.path(), k);
    const std::vector<int64_t> v = t.to_vector<int64_t>();
    std::vector<uint8_t>& out = s.bytes[k];
    for (int64_t x : v) {
      CZ_CHECK_IO(x >= 0 && x <= 255, "{}: dataset 'state/{}' holds {}, not a byte", file.path(), k, x);
      out.push_back(uint8_t(x));
    }
  }
  return s;
}

std::string rank_file_name(int rank) {
  return fmt::format("rank_{:05d}.h5", rank);
}
std::string step_dir_name(int64_t step) {
  return fmt::format("step_{}", step);
}
std::string temp_dir_name(int64_t step) {
  return fmt::format(".tmp-step_{}", step);
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("{}: cannot create the folder: {}", dir, ec.message()));
  CZ_CHECK_IO(is_dir(dir), "{}: exists and is not a folder", dir);
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail_errno(dir, "cannot open the folder to sync it");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  errno = err;
  if (rc != 0) fail_errno(dir, "cannot sync the folder");
}

void remove_tree_quietly(const std::string& path) noexcept {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

void remove_leftovers(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-step_", 0) == 0 || name.rfind(".del-step_", 0) == 0 || name == ".latest.tmp")
      remove_tree_quietly(e.path().string());
  }
  if (ec) throw IoError(fmt::format("{}: cannot list the folder: {}", dir, ec.message()));
}

void publish_dir(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) == 0) return;
  if (errno != ENOTEMPTY && errno != EEXIST) fail_errno(to, fmt::format("cannot rename {} to it", from));
  // `to` exists (the same step saved again): swap the two atomically, then drop the old one.
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    remove_tree_quietly(from);
    return;
  }
  // No atomic exchange on this file system: the old one is out of sight for a moment.
  const size_t slash = to.rfind('/');
  const std::string doomed = to.substr(0, slash + 1) + ".del-" + to.substr(slash + 1);
  remove_tree_quietly(doomed);
  if (::rename(to.c_str(), doomed.c_str()) != 0) fail_errno(to, "cannot move the old checkpoint aside");
  if (::rename(from.c_str(), to.c_str()) != 0) fail_errno(to, fmt::format("cannot rename {} to it", from));
  remove_tree_quietly(doomed);
}

void write_file_durably(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string temp = dir + "/." + name + ".tmp", path = dir + "/" + name;
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail_errno(temp, "cannot create");
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  errno = err;
  if (!ok) {
    ::unlink(temp.c_str());
    fail_errno(temp, "cannot write");
  }
  if (::rename(temp.c_str(), path.c_str()) != 0)
    fail_errno(path, fmt::format("cannot rename .{}.tmp to it", name));
  sync_dir(dir);
}

void write_latest(const std::string& dir, const std::string& name) {
  write_file_durably(dir, "latest", name + "\n");
}

std::optional<std::string> read_latest(const std::string& dir) {
  std::FILE* f = std::fopen((dir + "/latest").c_str(), "r");
  if (!f) return std::nullopt;
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string name(buf, n);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty() || !bad_name(name, "checkpoint").empty()) return std::nullopt;
  return name;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.size() == 5 || name.size() > 24) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (!is_file(e.path().string() + "/" + kIndexFile)) continue;
    found.emplace_back(std::stoll(name.substr(5)), e.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> prune(const std::string& dir, int64_t newest_step, int64_t keep) {
  std::vector<std::string> doomed;
  if (keep <= 0) return doomed;
  std::vector<std::pair<int64_t, std::string>> older;
  for (auto& c : list_checkpoints(dir))
    if (c.first < newest_step) older.push_back(std::move(c));
  const int64_t excess = int64_t(older.size()) - (keep - 1);
  for (int64_t i = 0; i < excess; ++i) {
    doomed.push_back(dir + "/.del-" + step_dir_name(older[size_t(i)].first));
    remove_tree_quietly(doomed.back());
    if (::rename(older[size_t(i)].second.c_str(), doomed.back().c_str()) != 0)
      fail_errno(older[size_t(i)].second, "cannot remove the old checkpoint");
  }
  if (!doomed.empty()) sync_dir(dir);
  return doomed;
}

std::string trim_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
int64_t file_bytes(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? int64_t(st.st_size) : -1;
}

}  // namespace cz::ckpt::detail
