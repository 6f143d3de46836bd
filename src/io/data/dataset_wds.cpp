// wds:PATTERN — uncompressed tar shards in WebDataset's layout, read through an index of member offsets per
// shard (tar_index.h), so that an image is one pread. Note [Sharded tar data].
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "io/data/dataset_sources.h"
#include "io/data/tar_index.h"
#include "io/decode/image_codec.h"
#include "tensor/check.h"

// Note [Sharded tar data]: a shard is a tar whose members are KEY.EXT, the members of one sample adjacent
// and sharing KEY (WebDataset's layout: KEY is the member's path up to the first dot of its last component,
// EXT the rest, as webdataset's base_plus_ext splits it). A sample is its image (.jpg, .jpeg or .png; the
// signature, not the name, tells JPEG from PNG) and its label (.cls, an integer in text, else .json with an
// integer "label"); other members (.txt, metadata) are ignored. The data set is the shards' samples in the
// pattern's order, each shard's in its member order: one flat index, so the loader's global order and equal
// per-rank shares (Note [Sampling]) do not see shards at all, whatever their sizes. Opening reads each
// shard's index (built once by scanning its headers, which keeps the label members' bytes; rebuilt when the
// shard's size or modification time changed), never the tar; a sample read is one pread of the image's bytes
// at its offset into a per-thread buffer, on a descriptor kept open per shard (up to half the process's
// descriptor limit; past it, opened per read). What cannot be used is found at open, the same on every rank:
// a shard that is missing, compressed, truncated or not a tar, a sample without its image or label, a label
// that is not an integer or out of range. Each is an IoError naming the shard and member, or, with
// `--skip-bad-samples N`, left out and named in describe() while there are at most N; an image that fails
// to decode is the loader's to skip (LoaderOptions::skip_bad_samples).

namespace cz {
namespace {

namespace fs = std::filesystem;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// webdataset's base_plus_ext: ("dir/a", "b.jpg") for "dir/a.b.jpg"; no dot in the last component: no key.
bool split_key(const std::string& name, std::string& key, std::string& ext) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos || dot == (slash == std::string::npos ? 0 : slash + 1)) return false;
  key = name.substr(0, dot);
  ext = lower(name.substr(dot + 1));
  return true;
}

bool is_image_ext(const std::string& ext) {
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The label a .cls or .json member holds, or an error text.
bool parse_label(const std::string& ext, const std::string& content, int64_t& label, std::string& why) {
  if (ext == "cls") {
    const std::string t = trim(content);
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), label);
    if (t.empty() || ec != std::errc() || end != t.data() + t.size()) {
      why = fmt::format("not an integer ('{}')", t.substr(0, 40));
      return false;
    }
    return true;
  }
  const nlohmann::json j = nlohmann::json::parse(content, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    why = "not a JSON object";
    return false;
  }
  const auto it = j.find("label");
  if (it == j.end() || !it->is_number_integer()) {
    why = "no integer \"label\" field";
    return false;
  }
  label = it->get<int64_t>();
  return true;
}

class WdsDataset final : public Dataset {
 public:
  WdsDataset(std::string pattern, const DatasetOptions& options) : pattern_(std::move(pattern)) {
    shards_ = expand_shard_pattern(pattern_);
    for (const std::string& s : shards_) {
      std::error_code ec;
      CZ_CHECK_IO(fs::is_regular_file(s, ec), "wds:{}: shard {} {} ({} shards in the pattern)", pattern_, s,
                  fs::exists(s, ec) ? "is not a file" : "does not exist", shards_.size());
    }
    read_classes();
    LeftOut bad;
    int64_t max_label = -1;
    for (size_t s = 0; s < shards_.size(); ++s) {
      bool built = false;
      TarIndex index = load_or_build_index(shards_[s], options.index_dir, &built);
      built_ += built ? 1 : 0;
      add_samples(uint32_t(s), index, bad, max_label);
    }
    if (bad.total() > options.skip_bad_samples) {
      CZ_CHECK_IO(options.skip_bad_samples > 0, "wds:{}: {}{}", pattern_, bad.first(),
                  bad.total() > 1
                      ? fmt::format(" ({} bad samples in all; --skip-bad-samples N leaves up to N "
                                    "out)",
                                    bad.total())
                      : " (--skip-bad-samples N leaves up to N bad samples out)");
      CZ_CHECK_IO(false, "wds:{}: {} bad samples, more than --skip-bad-samples {}: {}", pattern_, bad.total(),
                  options.skip_bad_samples, bad.describe(" bad sample(s)"));
    }
    bad_ = bad.total();
    bad_text_ = bad.total() > 0 ? bad.describe(" bad sample(s)") : "";
    CZ_CHECK_IO(!samples_.empty(), "wds:{}: no samples in {} shard(s){}", pattern_, shards_.size(),
                bad_text_.empty() ? "" : " (" + bad_text_ + ")");
    num_classes_ = names_.empty() ? max_label + 1 : int64_t(names_.size());
    rlimit lim{};
    const int64_t limit = getrlimit(RLIMIT_NOFILE, &lim) == 0 ? int64_t(lim.rlim_cur) : 1024;
    max_open_ = std::max<int64_t>(0, std::min<int64_t>(limit / 2, 65536));
    fds_ = std::make_unique<std::atomic<int>[]>(shards_.size());
    for (size_t s = 0; s < shards_.size(); ++s) fds_[s] = -1;
  }

  ~WdsDataset() override {
    for (size_t s = 0; s < shards_.size(); ++s)
      if (fds_[s] >= 0) ::close(fds_[s]);
  }

  int64_t size() const override { return int64_t(samples_.size()); }
  int64_t num_classes() const override { return num_classes_; }
  int64_t label(int64_t index) const override { return samples_[size_t(index)].label; }
  std::vector<std::string> class_names() const override { return names_; }
  int64_t bad_samples() const override { return bad_; }
  // "wds:/d/train-{0..3}.tar (4 shards, 1000 images, 10 classes: ...; 4 indexes built)"
  std::string describe() const override {
    return fmt::format("wds:{} ({} shard(s), {} images, {} classes{}{}{})", pattern_, shards_.size(), size(),
                       num_classes_, names_.empty() ? "" : ": " + join_names(names_),
                       built_ > 0 ? fmt::format("; {} index(es) built", built_) : "",
                       bad_text_.empty() ? "" : "; " + bad_text_);
  }

  void read(int64_t index, Image& out) const override {
    thread_local std::vector<uint8_t> bytes;
    const std::string name = fetch(index, bytes);
    decode_image(bytes.data(), bytes.size(), name, out);
  }

  void read_crop(int64_t index, const CropChooser& choose, int64_t out_size, Image& out,
                 CropBox& box) const override {
    thread_local std::vector<uint8_t> bytes;
    const std::string name = fetch(index, bytes);
    decode_crop(bytes.data(), bytes.size(), name, choose, out_size, out, box);
  }

 private:
  struct Sample {
    uint64_t offset = 0;   // the image's bytes in its shard
    uint64_t name_at = 0;  // the image member's name in names_blob_
    uint32_t size = 0, shard = 0;
    int32_t label = 0;
    uint16_t name_len = 0;
  };

  // classes.txt beside the first shard: one class name a line, label i the i-th line.
  void read_classes() {
    const fs::path p = fs::path(shards_.front()).parent_path() / "classes.txt";
    std::ifstream in(p);
    if (!in) return;
    for (std::string line; std::getline(in, line);) names_.push_back(trim(line));
    while (!names_.empty() && names_.back().empty()) names_.pop_back();
    for (size_t i = 0; i < names_.size(); ++i)
      CZ_CHECK_IO(!names_[i].empty(), "wds:{}: {} line {} is empty (one class name a line)", pattern_,
                  p.string(), i + 1);
  }

  // The index's members grouped by key into samples.
  void add_samples(uint32_t shard, const TarIndex& index, LeftOut& bad, int64_t& max_label) {
    const std::string& path = shards_[shard];
    size_t i = 0;
    const std::vector<TarMember>& m = index.members;
    while (i < m.size()) {
      std::string key, ext;
      if (!split_key(m[i].name, key, ext)) {  // webdataset skips these too
        ++i;
        continue;
      }
      const TarMember *image = nullptr, *cls = nullptr, *json = nullptr, *webp = nullptr;
      std::string image_ext, duplicate;
      size_t j = i;
      for (std::string k, e; j < m.size() && split_key(m[j].name, k, e) && k == key; ++j) {
        const TarMember** slot = is_image_ext(e) ? &image
                                 : e == "cls"    ? &cls
                                 : e == "json"   ? &json
                                 : e == "webp"   ? &webp
                                                 : nullptr;
        if (slot == nullptr) continue;
        if (*slot != nullptr) duplicate = m[j].name;
        *slot = &m[j];
        if (is_image_ext(e)) image_ext = e;
      }
      i = j;
      const std::string where = fmt::format("{}: member {}", path, image ? image->name : key);
      // A truncated shard's last sample may have lost members that were never written: the scan's error.
      if (i == m.size() && !index.error.empty()) break;
      if (!duplicate.empty()) {
        bad.add(fmt::format("two members for one sample ({})", duplicate), where);
        continue;
      }
      if (image == nullptr) {
        bad.add(webp ? "a .webp image, which this build cannot decode (jpg, jpeg, png)"
                     : "no image member (.jpg, .jpeg or .png)",
                where);
        continue;
      }
      const TarMember* label_member = cls ? cls : json;
      if (label_member == nullptr) {
        bad.add("no label member (.cls or .json)", where);
        continue;
      }
      int64_t label = 0;
      std::string why;
      if (label_member->size > kMaxLabelBytes) {
        bad.add(fmt::format("label member {} over {} bytes", label_member->name, kMaxLabelBytes), where);
        continue;
      }
      if (!parse_label(cls ? "cls" : "json", label_member->content, label, why)) {
        bad.add(fmt::format("label {}", why), fmt::format("{}: member {}", path, label_member->name));
        continue;
      }
      const int64_t limit = names_.empty() ? (int64_t(1) << 31) - 1 : int64_t(names_.size());
      if (label < 0 || label >= limit) {
        bad.add(names_.empty() ? fmt::format("label {} out of range [0, 2^31 - 1)", label)
                               : fmt::format("label {} out of range [0, {}) (classes.txt has {} names)",
                                             label, limit, limit),
                fmt::format("{}: member {}", path, label_member->name));
        continue;
      }
      if (image->size >= (uint64_t(1) << 32)) {
        bad.add("an image over 4 GiB", where);
        continue;
      }
      max_label = std::max(max_label, label);
      Sample s;
      s.offset = image->offset;
      s.size = uint32_t(image->size);
      s.shard = shard;
      s.label = int32_t(label);
      s.name_at = names_blob_.size();
      s.name_len = uint16_t(std::min<size_t>(image->name.size(), 65535));
      names_blob_.append(image->name, 0, s.name_len);
      samples_.push_back(s);
    }
    if (!index.error.empty()) bad.add(fmt::format("{} (the shard's end is lost)", index.error), path);
  }

  // The descriptor of `shard`, opened once and kept while fewer than max_open_ are; -1 with `temporary` set
  // when the caller is to open one for this read.
  int shard_fd(uint32_t shard, bool& temporary) const {
    temporary = false;
    int fd = fds_[shard].load(std::memory_order_acquire);
    if (fd >= 0) return fd;
    if (open_.load() >= max_open_) {
      temporary = true;
      fd = ::open(shards_[shard].c_str(), O_RDONLY | O_CLOEXEC);
      CZ_CHECK_IO(fd >= 0, "{}: cannot open: {}", shards_[shard], std::strerror(errno));
      return fd;
    }
    fd = ::open(shards_[shard].c_str(), O_RDONLY | O_CLOEXEC);
    CZ_CHECK_IO(fd >= 0, "{}: cannot open: {}", shards_[shard], std::strerror(errno));
    int expected = -1;
    if (fds_[shard].compare_exchange_strong(expected, fd, std::memory_order_acq_rel)) {
      ++open_;
      return fd;
    }
    ::close(fd);  // another thread opened it first
    return expected;
  }

  // Sample `index`'s image bytes into `bytes`; returns the name its errors go by ("SHARD: member M").
  std::string fetch(int64_t index, std::vector<uint8_t>& bytes) const {
    CZ_CHECK(index >= 0 && index < size(), "wds:{}: index {} out of range [0, {})", pattern_, index, size());
    const Sample& s = samples_[size_t(index)];
    const std::string name = fmt::format("{}: member {}", shards_[s.shard],
                                         std::string_view(names_blob_).substr(s.name_at, s.name_len));
    bytes.resize(s.size);
    bool temporary = false;
    const int fd = shard_fd(s.shard, temporary);
    uint64_t done = 0;
    while (done < s.size) {
      const ssize_t got = ::pread(fd, bytes.data() + done, s.size - done, off_t(s.offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += uint64_t(got);
    }
    const int err = errno;
    if (temporary) ::close(fd);
    CZ_CHECK_IO(done == s.size,
                "{}: read {} of its {} bytes at offset {} ({}); the shard changed since it was indexed?",
                name, done, s.size, s.offset, done < s.size && err != 0 ? std::strerror(err) : "end of file");
    return name;
  }

  std::string pattern_;
  std::vector<std::string> shards_;
  std::vector<std::string> names_;
  std::vector<Sample> samples_;
  std::string names_blob_;
  int64_t num_classes_ = 0, bad_ = 0, built_ = 0;
  std::string bad_text_;
  int64_t max_open_ = 0;
  mutable std::atomic<int64_t> open_{0};
  std::unique_ptr<std::atomic<int>[]> fds_;
};

}  // namespace

std::shared_ptr<const Dataset> open_wds(const std::string& pattern, const DatasetOptions& options) {
  return std::make_shared<WdsDataset>(pattern, options);
}

}  // namespace cz
