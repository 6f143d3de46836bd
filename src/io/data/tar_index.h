// Uncompressed tar files (ustar, with GNU long names and pax paths) as a table of their members' data
// offsets, kept in an index file beside the tar or in a cache folder, so that reading a member is one pread;
// and the shard patterns of `wds:` (brace ranges and comma lists). Note [Sharded tar data] in
// dataset_wds.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cz {

// One regular file of a tar: its path inside the tar, where its bytes start and how many there are. The
// bytes of label members (is_label_member) are kept in `content`, so that opening a data set reads no tar.
struct TarMember {
  std::string name;
  uint64_t offset = 0, size = 0;
  std::string content;
};

// The members of one tar, in their order, and what was wrong with it: `error` is empty for a whole tar, else
// it says why the scan stopped ("member a/b.jpg: needs bytes [1536, 9000) but the file ends at 4096"); the
// members before that point are kept. `file_size` and `mtime_ns` are the tar's when it was scanned.
struct TarIndex {
  uint64_t file_size = 0;
  int64_t mtime_ns = 0;
  std::vector<TarMember> members;
  std::string error;
};

// Members whose bytes the index keeps: WebDataset's label files, KEY.cls and KEY.json (any letter case), of
// at most kMaxLabelBytes.
bool is_label_member(const std::string& name);
inline constexpr uint64_t kMaxLabelBytes = uint64_t(1) << 16;

// Reads the tar's headers (one pread each) and the label members. IoError naming the file when it cannot be
// opened or is compressed (gzip, bzip2, xz, zstd: the reader needs the members' offsets in the file); a
// malformed or truncated tar is reported in TarIndex::error instead.
TarIndex scan_tar(const std::string& path);

// Where an index is looked for and written: `index_dir` when given (`--data-index-dir`), else beside the
// tar (PATH.czidx) and, where that folder cannot be written, the user's cache folder
// ($XDG_CACHE_HOME or ~/.cache, then convnext_zero/wds-index/), named by a hash of the tar's absolute path.
struct IndexPlace {
  std::vector<std::string> read;  // looked for in this order
  std::string write;              // where a new one goes ("": try read[] in order)
};
IndexPlace index_places(const std::string& tar_path, const std::string& index_dir);

// The tar's index: read from the first index file whose recorded size and modification time are the tar's
// now, else scanned and written (atomically: to a temporary name, then renamed; ranks building the same
// index at once each write a whole one). `built` says whether it was scanned. A place that cannot be
// written is passed over silently (the index then lives only in memory for this run).
TarIndex load_or_build_index(const std::string& tar_path, const std::string& index_dir,
                             bool* built = nullptr);

// The index file's bytes and back (for tests); parse returns false for a file of another format or version.
std::string serialize_index(const TarIndex& index);
bool parse_index(const std::string& bytes, TarIndex& out);

// The shard list of a `wds:` pattern: comma-separated parts, each with brace expressions expanded as
// WebDataset's braceexpand does: {000..012} a range (zero-padded to the wider end when either end has a
// leading zero), {a,b,c} alternatives, nested and repeated ("d{0..1}/s{00..02}.tar" is 6 paths). A part that
// is a folder stands for the *.tar files in it, sorted by name. ValueError naming the pattern for an
// unbalanced brace, a descending or non-numeric range, or more than 2^20 paths.
std::vector<std::string> expand_shard_pattern(const std::string& pattern);

}  // namespace cz
