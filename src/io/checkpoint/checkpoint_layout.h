// Internal to the checkpoint code: the manifest (which rank file holds which slice), its JSON form, the
// coverage check, scalar attributes, and the folder operations that make a checkpoint appear atomically.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint/checkpoint.h"
#include "io/h5/h5_file.h"

namespace cz::ckpt::detail {

struct SliceEntry {
  int rank = 0;
  int64_t begin = 0;
  int64_t numel = 0;
  std::string dataset;  // in the rank's file
};

struct TensorEntry {
  std::string name;
  Shape shape;
  std::vector<SliceEntry> slices;  // sorted by begin once validated
};

struct GroupEntry {
  std::string name;
  std::vector<TensorEntry> tensors;
};

// The names (not values) of a Scalars, by kind; the values live in attributes and datasets.
struct ScalarNames {
  std::vector<std::string> ints, floats, strings, bytes;
};

struct RankEntry {
  std::string file;
  int64_t bytes = 0;
  ScalarNames scalars;
};

struct Manifest {
  int64_t step = 0;
  int world_size = 0;
  int stage = 0;
  ScalarNames scalars;
  std::vector<RankEntry> ranks;
  std::vector<GroupEntry> groups;
};

nlohmann::json to_json(const Manifest& m);
// IoError naming `where` when `j` is not a manifest of this format.
Manifest manifest_from_json(const nlohmann::json& j, const std::string& where);

// One line per fault: slices whose shapes disagree, ranges outside the tensor, gaps, overlaps (at most a
// dozen, then a count). Sorts each tensor's slices by begin.
std::vector<std::string> coverage_problems(Manifest& m);

// Names that are not usable as a tensor, group or scalar name; empty when fine.
std::string bad_name(const std::string& name, const char* what);
std::string bad_scalar_names(const Scalars& s);

ScalarNames names_of(const Scalars& s);
// Ints, floats and strings as root attributes; bytes as checksummed u8 datasets state/<name>.
void write_scalars(h5::File& file, const Scalars& s);
Scalars read_scalars(const h5::File& file, const ScalarNames& names);

std::string rank_file_name(int rank);     // rank_00003.h5
std::string step_dir_name(int64_t step);  // step_120
std::string temp_dir_name(int64_t step);  // .tmp-step_120

// Folder operations. Each throws IoError naming the path and errno's reason.
void make_dirs(const std::string& dir);
void sync_dir(const std::string& dir);
// Removes a tree that is not a checkpoint (a temporary or doomed one); failures are ignored.
void remove_tree_quietly(const std::string& path) noexcept;
// Removes what interrupted saves and prunes left behind (.tmp-step_*, .del-step_*, .latest.tmp).
void remove_leftovers(const std::string& dir);
// Makes `from` visible as `to` atomically: a rename, or an exchange with an existing `to` (whose old contents
// are then removed).
void publish_dir(const std::string& from, const std::string& to);
// Writes DIR/NAME whole or not at all: DIR/.NAME.tmp, synced, renamed over it, DIR synced.
void write_file_durably(const std::string& dir, const std::string& name, const std::string& text);
void write_latest(const std::string& dir, const std::string& name);  // DIR/latest: "step_N\n"
std::optional<std::string> read_latest(const std::string& dir);
// The step_N folders of `dir` that hold an index file, by step.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);
// Takes the checkpoints older than `newest_step` beyond the `keep - 1` most recent of them out of sight:
// renamed to .del-step_N (so a crash part-way never leaves a half-removed step_N). Returns those folders,
// which the caller removes (remove_tree_quietly); remove_leftovers gets any it did not.
std::vector<std::string> prune(const std::string& dir, int64_t newest_step, int64_t keep);
std::string trim_slashes(std::string path);  // "a/b//" -> "a/b"; "/" stays
bool is_file(const std::string& path);
bool is_dir(const std::string& path);
int64_t file_bytes(const std::string& path);  // -1 when missing

}  // namespace cz::ckpt::detail
