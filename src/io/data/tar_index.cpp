// The tar reader behind `wds:` (tar_index.h): ustar headers, GNU long names and pax paths; index files; shard
// patterns.
#include "io/data/tar_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "tensor/check.h"

namespace cz {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kBlock = 512;

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Reads exactly n bytes at `offset`, retrying short reads; false at the end of the file or on an error.
bool pread_all(int fd, void* buf, uint64_t n, uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= uint64_t(got);
    offset += uint64_t(got);
  }
  return true;
}

uint64_t round_up(uint64_t n) {
  return (n + kBlock - 1) / kBlock * kBlock;
}

// A numeric header field: octal digits (space or NUL terminated, leading spaces allowed) or, with the
// field's first byte's top bit set, GNU's base-256 big-endian number. False when it is neither.
bool parse_number(const uint8_t* f, size_t len, uint64_t& out) {
  out = 0;
  if (f[0] & 0x80) {
    if (f[0] & 0x40) return false;  // negative
    out = f[0] & 0x3f;
    for (size_t i = 1; i < len; ++i) {
      if (out >> 56) return false;
      out = out << 8 | f[i];
    }
    return true;
  }
  size_t i = 0;
  while (i < len && f[i] == ' ') ++i;
  bool any = false;
  for (; i < len && f[i] >= '0' && f[i] <= '7'; ++i) {
    out = out * 8 + uint64_t(f[i] - '0');
    any = true;
  }
  for (; i < len; ++i)
    if (f[i] != ' ' && f[i] != 0) return false;
  return any;
}

std::string field_text(const uint8_t* f, size_t len) {
  return std::string(reinterpret_cast<const char*>(f), strnlen(reinterpret_cast<const char*>(f), len));
}

// The header's checksum: its bytes summed with the checksum field read as spaces (unsigned, as POSIX says;
// some old writers summed signed bytes, which is accepted too).
bool checksum_ok(const uint8_t* h) {
  uint64_t stored = 0;
  if (!parse_number(h + 148, 8, stored)) return false;
  int64_t sum_u = 0, sum_s = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    const uint8_t b = (i >= 148 && i < 156) ? uint8_t(' ') : h[i];
    sum_u += b;
    sum_s += int8_t(b);
  }
  return int64_t(stored) == sum_u || int64_t(stored) == sum_s;
}

// The "path" record of a pax extended header ("27 path=a/very/long/name.jpg\n" ...), or "".
std::string pax_path(const std::string& data) {
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t space = data.find(' ', pos);
    if (space == std::string::npos) break;
    const uint64_t len = std::strtoull(data.c_str() + pos, nullptr, 10);
    if (len == 0 || pos + len > data.size()) break;
    const std::string record = data.substr(space + 1, pos + len - space - 2);  // without the newline
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    pos += len;
  }
  return "";
}

// What a compressed file starts with, or null for anything else.
const char* compression_of(const uint8_t* b, size_t n) {
  if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b) return "gzip";
  if (n >= 3 && b[0] == 'B' && b[1] == 'Z' && b[2] == 'h') return "bzip2";
  if (n >= 6 && std::memcmp(b,
                            "\xfd"
                            "7zXZ\0",
                            6) == 0)
    return "xz";
  if (n >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd) return "zstd";
  return nullptr;
}

const char* decompress_command(const std::string& kind) {
  if (kind == "gzip") return "gunzip";
  if (kind == "bzip2") return "bunzip2";
  if (kind == "xz") return "unxz";
  return "unzstd";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

constexpr char kIndexMagic[8] = {'C', 'Z', 'T', 'A', 'R', 'I', 'X', '1'};

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_string(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}

struct Reader {
  const std::string& s;
  size_t pos = 0;
  template <class T>
  bool get(T& v) {
    if (pos + sizeof v > s.size()) return false;
    std::memcpy(&v, s.data() + pos, sizeof v);
    pos += sizeof v;
    return true;
  }
  bool get_string(std::string& v) {
    uint64_t n = 0;
    if (!get(n) || n > s.size() - pos) return false;
    v.assign(s.data() + pos, n);
    pos += n;
    return true;
  }
};

std::string hex_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return fmt::format("{:016x}", h);
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Writes `bytes` to `path` through a temporary file renamed over it; false when the folder is not writable.
bool write_atomically(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), std::random_device{}());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return false;
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out) {
      fs::remove(tmp, ec);
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace

bool is_label_member(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) return false;
  const std::string ext = lower(name.substr(dot + 1));
  return ext == "cls" || ext == "json";
}

namespace {

// A member's header block, parsed: its type flag, size and name (the ustar prefix joined, or the long name
// the member before gave it).
struct TarHeader {
  char type = 0;
  uint64_t size = 0;
  std::string name;
};

// "member NAME" of the last member indexed, or "the start", for the errors.
std::string after_last(const TarIndex& index) {
  return index.members.empty() ? std::string("the start")
                               : fmt::format("member {}", index.members.back().name);
}

// Reads and parses the header at `pos` into `out`: true for a member's header; false at the end of the
// archive (index.error empty) or on a truncated, unreadable or malformed header (index.error says which).
bool read_header(int fd, uint64_t pos, std::string& long_name, TarIndex& index, TarHeader& out) {
  if (pos + kBlock > index.file_size) {
    index.error = pos == index.file_size
                      ? fmt::format("truncated: the file ends after {} without the end-of-archive blocks",
                                    after_last(index))
                      : fmt::format("truncated: the file ends inside the header at byte {}, after {}", pos,
                                    after_last(index));
    return false;
  }
  std::array<uint8_t, kBlock> h{};
  if (!pread_all(fd, h.data(), kBlock, pos)) {
    index.error = fmt::format("cannot read the header at byte {}: {}", pos, std::strerror(errno));
    return false;
  }
  if (std::all_of(h.begin(), h.end(), [](uint8_t b) { return b == 0; })) return false;  // end of archive
  if (!checksum_ok(h.data())) {
    index.error = pos == 0 ? std::string("not a tar file (its first 512 bytes are no tar header)")
                           : fmt::format("the header at byte {} (after {}) is no tar header: bad checksum",
                                         pos, after_last(index));
    return false;
  }
  if (!parse_number(h.data() + 124, 12, out.size)) {
    index.error = fmt::format("the header at byte {} has no valid size", pos);
    return false;
  }
  out.type = char(h[156]);
  out.name = field_text(h.data(), 100);
  if (std::memcmp(h.data() + 257, "ustar", 5) == 0 && h[345] != 0)
    out.name = field_text(h.data() + 345, 155) + "/" + out.name;
  if (!long_name.empty() && out.type != 'L' && out.type != 'x') out.name = std::exchange(long_name, "");
  return true;
}

// What member `hd`, whose bytes start at `data`, adds: a long name for the next member ('L', pax 'x'), or a
// file member (with a label's bytes); folders, links, devices and pax global headers ('g') hold no sample's
// bytes. False with index.error on a failed read.
bool take_member(int fd, const TarHeader& hd, uint64_t data, std::string& long_name, TarIndex& index) {
  if (hd.type == 'L' || hd.type == 'x') {  // the next member's name
    std::string text(size_t(std::min<uint64_t>(hd.size, 1 << 20)), '\0');
    if (!pread_all(fd, text.data(), text.size(), data)) {
      index.error = fmt::format("cannot read the long name at byte {}", data);
      return false;
    }
    long_name = hd.type == 'L' ? std::string(text.c_str()) : pax_path(text);
  } else if (hd.type == '0' || hd.type == '\0' || hd.type == '7') {
    TarMember m{hd.name, data, hd.size, {}};
    if (is_label_member(hd.name) && hd.size <= kMaxLabelBytes) {
      m.content.resize(size_t(hd.size));
      if (hd.size > 0 && !pread_all(fd, m.content.data(), hd.size, data)) {
        index.error = fmt::format("cannot read member {}", hd.name);
        return false;
      }
    }
    index.members.push_back(std::move(m));
  }
  return true;
}

}  // namespace

TarIndex scan_tar(const std::string& path) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  CZ_CHECK_IO(f.fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  CZ_CHECK_IO(::fstat(f.fd, &st) == 0, "{}: cannot stat: {}", path, std::strerror(errno));
  TarIndex index;
  index.file_size = uint64_t(st.st_size);
  index.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  std::array<uint8_t, kBlock> h{};
  const uint64_t first = std::min<uint64_t>(index.file_size, kBlock);
  CZ_CHECK_IO(first == 0 || pread_all(f.fd, h.data(), first, 0), "{}: cannot read: {}", path,
              std::strerror(errno));
  if (const char* kind = compression_of(h.data(), first))
    CZ_CHECK_IO(false,
                "{}: a {}-compressed tar; wds: reads uncompressed tars, whose members it reads in place "
                "(`{} {}`, or write the shards uncompressed)",
                path, kind, decompress_command(kind), path);

  std::string long_name;  // from a GNU 'L' member or a pax 'x' header, for the next member
  uint64_t pos = 0;
  TarHeader hd;
  while (read_header(f.fd, pos, long_name, index, hd)) {
    const uint64_t data = pos + kBlock;
    if (data + hd.size > index.file_size) {
      index.error = fmt::format("truncated: member {} needs bytes [{}, {}) but the file ends at {}", hd.name,
                                data, data + hd.size, index.file_size);
      return index;
    }
    if (!take_member(f.fd, hd, data, long_name, index)) return index;
    pos = data + round_up(hd.size);
  }
  return index;
}

std::string serialize_index(const TarIndex& index) {
  std::string s(kIndexMagic, sizeof kIndexMagic);
  put<uint64_t>(s, index.file_size);
  put<int64_t>(s, index.mtime_ns);
  put_string(s, index.error);
  put<uint64_t>(s, index.members.size());
  for (const TarMember& m : index.members) {
    put_string(s, m.name);
    put<uint64_t>(s, m.offset);
    put<uint64_t>(s, m.size);
    put_string(s, m.content);
  }
  return s;
}

bool parse_index(const std::string& bytes, TarIndex& out) {
  if (bytes.size() < sizeof kIndexMagic || std::memcmp(bytes.data(), kIndexMagic, sizeof kIndexMagic) != 0)
    return false;
  Reader r{bytes, sizeof kIndexMagic};
  TarIndex index;
  uint64_t n = 0;
  if (!r.get(index.file_size) || !r.get(index.mtime_ns) || !r.get_string(index.error) || !r.get(n))
    return false;
  if (n > bytes.size()) return false;  // each member takes more than a byte
  index.members.resize(size_t(n));
  for (TarMember& m : index.members)
    if (!r.get_string(m.name) || !r.get(m.offset) || !r.get(m.size) || !r.get_string(m.content)) return false;
  if (r.pos != bytes.size()) return false;
  out = std::move(index);
  return true;
}

IndexPlace index_places(const std::string& tar_path, const std::string& index_dir) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(tar_path, ec);
  const std::string cached_name =
      hex_hash(absolute.string()) + "-" + fs::path(tar_path).filename().string() + ".czidx";
  if (!index_dir.empty()) {
    const std::string p = (fs::path(index_dir) / cached_name).string();
    return {{p}, p};
  }
  std::string cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != 0)
    cache = x;
  else if (const char* home = std::getenv("HOME"); home != nullptr && *home != 0)
    cache = std::string(home) + "/.cache";
  IndexPlace place;
  place.read.push_back(tar_path + ".czidx");
  if (!cache.empty())
    place.read.push_back((fs::path(cache) / "convnext_zero/wds-index" / cached_name).string());
  return place;
}

TarIndex load_or_build_index(const std::string& tar_path, const std::string& index_dir, bool* built) {
  struct stat st {};
  CZ_CHECK_IO(::stat(tar_path.c_str(), &st) == 0, "{}: {}", tar_path, std::strerror(errno));
  const int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  const IndexPlace place = index_places(tar_path, index_dir);
  for (const std::string& p : place.read) {
    TarIndex index;
    if (parse_index(read_whole(p), index) && index.file_size == uint64_t(st.st_size) &&
        index.mtime_ns == mtime) {
      if (built != nullptr) *built = false;
      return index;
    }
  }
  TarIndex index = scan_tar(tar_path);
  if (built != nullptr) *built = true;
  const std::string bytes = serialize_index(index);
  if (!place.write.empty()) {
    write_atomically(place.write, bytes);
  } else {
    for (const std::string& p : place.read)
      if (write_atomically(p, bytes)) break;
  }
  return index;
}

namespace {

constexpr size_t kMaxShards = size_t(1) << 20;

// The brace expression's alternatives: "000..012" as a range, "a,b" split at its top-level commas.
std::vector<std::string> alternatives(const std::string& body, const std::string& pattern) {
  const size_t dots = body.find("..");
  const bool digits = dots != std::string::npos && dots > 0 && dots + 2 < body.size() &&
                      std::all_of(body.begin(), body.begin() + long(dots), ::isdigit) &&
                      std::all_of(body.begin() + long(dots) + 2, body.end(), ::isdigit);
  if (digits) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    CZ_CHECK(a.size() <= 18 && b.size() <= 18, "wds:{}: range {{{}}} has numbers too long", pattern, body);
    const uint64_t lo = std::stoull(a), hi = std::stoull(b);
    CZ_CHECK(lo <= hi, "wds:{}: range {{{}}} goes down", pattern, body);
    CZ_CHECK(hi - lo < kMaxShards, "wds:{}: range {{{}}} has more than 2^20 values", pattern, body);
    const bool pad = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
    const size_t width = pad ? std::max(a.size(), b.size()) : 0;
    std::vector<std::string> out;
    for (uint64_t v = lo; v <= hi; ++v) out.push_back(fmt::format("{:0{}}", v, width));
    return out;
  }
  CZ_CHECK(body.find("..") == std::string::npos || body.find(',') != std::string::npos,
           "wds:{}: range {{{}}} is not two unsigned integers", pattern, body);
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= body.size(); ++i) {
    if (i == body.size() || (body[i] == ',' && depth == 0)) {
      out.push_back(body.substr(start, i - start));
      start = i + 1;
    } else if (body[i] == '{') {
      ++depth;
    } else if (body[i] == '}') {
      --depth;
    }
  }
  return out;
}

void expand_into(const std::string& part, const std::string& pattern, std::vector<std::string>& out) {
  const size_t open = part.find('{');
  if (open == std::string::npos) {
    CZ_CHECK(part.find('}') == std::string::npos, "wds:{}: '}}' without '{{'", pattern);
    CZ_CHECK(out.size() < kMaxShards, "wds:{}: more than 2^20 shards", pattern);
    out.push_back(part);
    return;
  }
  int depth = 0;
  size_t close = std::string::npos;
  for (size_t i = open; i < part.size(); ++i) {
    if (part[i] == '{') ++depth;
    if (part[i] == '}' && --depth == 0) {
      close = i;
      break;
    }
  }
  CZ_CHECK(close != std::string::npos, "wds:{}: '{{' without '}}'", pattern);
  const std::string head = part.substr(0, open), tail = part.substr(close + 1);
  for (const std::string& alt : alternatives(part.substr(open + 1, close - open - 1), pattern))
    expand_into(head + alt + tail, pattern, out);
}

}  // namespace

std::vector<std::string> expand_shard_pattern(const std::string& pattern) {
  CZ_CHECK(!pattern.empty(), "wds: needs a pattern: wds:DIR/train-{{000000..000009}}.tar");
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= pattern.size(); ++i) {
    if (i < pattern.size() && pattern[i] == '{') ++depth;
    if (i < pattern.size() && pattern[i] == '}') --depth;
    if (i < pattern.size() && !(pattern[i] == ',' && depth == 0)) continue;
    const std::string part = pattern.substr(start, i - start);
    start = i + 1;
    if (part.empty()) continue;
    std::error_code ec;
    if (part.find('{') == std::string::npos && fs::is_directory(part, ec)) {
      std::vector<std::string> tars;
      for (fs::directory_iterator it(part, ec), end; !ec && it != end; it.increment(ec))
        if (it->path().extension() == ".tar" && it->path().filename().string()[0] != '.')
          tars.push_back(it->path().string());
      CZ_CHECK_IO(!ec, "wds:{}: cannot list {}: {}", pattern, part, ec.message());
      CZ_CHECK_IO(!tars.empty(), "wds:{}: folder {} has no .tar files", pattern, part);
      std::sort(tars.begin(), tars.end());
      out.insert(out.end(), tars.begin(), tars.end());
      continue;
    }
    expand_into(part, pattern, out);
  }
  CZ_CHECK(depth == 0, "wds:{}: unbalanced braces", pattern);
  CZ_CHECK(!out.empty(), "wds:{}: no shards", pattern);
  return out;
}

}  // namespace cz
