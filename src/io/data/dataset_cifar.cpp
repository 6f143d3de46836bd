// cifar10:DIR — the official binary batches: data_batch_1..5.bin (train) and test_batch.bin (eval), each a
// sequence of 3073-byte records (label byte, then 1024 red, 1024 green and 1024 blue bytes of a 32x32 image).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "io/data/dataset_sources.h"
#include "tensor/check.h"

namespace cz {
namespace {

constexpr int64_t kSide = 32, kPlane = kSide * kSide, kRecord = 1 + 3 * kPlane, kClasses = 10;

// One batch file, kept open for positional reads (pread is safe from several threads on one descriptor).
struct BatchFile {
  std::string path;
  int fd = -1;
  int64_t records = 0;
};

class Cifar10Dataset final : public Dataset {
 public:
  Cifar10Dataset(std::string dir, Split split) : dir_(std::move(dir)), split_(split) {}
  ~Cifar10Dataset() override {
    for (const BatchFile& f : files_) ::close(f.fd);
  }

  // Opens and validates one batch file and takes its labels.
  void add_file(const std::string& path) {
    BatchFile f{path, ::open(path.c_str(), O_RDONLY | O_CLOEXEC), 0};
    CZ_CHECK_IO(f.fd >= 0, "cifar10:{}: cannot open: {}", path, std::strerror(errno));
    files_.push_back(f);  // closed by the destructor from here on
    const off_t bytes = ::lseek(f.fd, 0, SEEK_END);
    CZ_CHECK_IO(bytes > 0 && bytes % kRecord == 0,
                "cifar10:{}: size {} bytes is not a positive multiple of the {}-byte record (truncated?)",
                path, int64_t(bytes), kRecord);
    files_.back().records = bytes / kRecord;
    first_.push_back(int64_t(labels_.size()));
    const int64_t records = files_.back().records, per_chunk = std::min<int64_t>(records, 1024);
    std::vector<uint8_t> chunk(size_t(kRecord * per_chunk));
    for (int64_t r = 0; r < records; r += per_chunk) {
      const int64_t n = std::min(per_chunk, records - r);
      read_exact(f, r * kRecord, chunk.data(), size_t(n * kRecord));
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t l = chunk[size_t(i * kRecord)];
        CZ_CHECK_IO(l < kClasses, "cifar10:{}: record {} has label {}, expected 0..9", path, r + i, int(l));
        labels_.push_back(l);
      }
    }
  }

  int64_t size() const override { return int64_t(labels_.size()); }
  int64_t num_classes() const override { return kClasses; }
  int64_t label(int64_t index) const override { return labels_[size_t(index)]; }
  std::string describe() const override {
    return fmt::format("cifar10:{} ({}, {} images, {} classes)", dir_, split_name(split_), size(), kClasses);
  }

  void read(int64_t index, Image& out) const override {
    CZ_CHECK(index >= 0 && index < size(), "cifar10:{}: index {} out of range [0, {})", dir_, index, size());
    const size_t f = size_t(std::upper_bound(first_.begin(), first_.end(), index) - first_.begin() - 1);
    uint8_t record[kRecord];
    read_exact(files_[f], (index - first_[f]) * kRecord, record, sizeof(record));
    out.height = out.width = kSide;
    out.pixels.resize(size_t(kPlane * 3));
    for (int64_t p = 0; p < kPlane; ++p)
      for (int64_t c = 0; c < 3; ++c) out.pixels[size_t(p * 3 + c)] = record[1 + c * kPlane + p];
  }

 private:
  static void read_exact(const BatchFile& f, int64_t offset, uint8_t* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(f.fd, dst + done, n - done, off_t(offset) + off_t(done));
      if (got < 0 && errno == EINTR) continue;
      CZ_CHECK_IO(got > 0, "cifar10:{}: read of {} bytes at offset {} failed: {}", f.path, n, offset,
                  got == 0 ? "unexpected end of file" : std::strerror(errno));
      done += size_t(got);
    }
  }

  std::string dir_;
  Split split_;
  std::vector<BatchFile> files_;
  std::vector<int64_t> first_;  // index of each file's first record
  std::vector<uint8_t> labels_;
};

}  // namespace

std::shared_ptr<const Dataset> open_cifar10(const std::string& dir, Split split) {
  namespace fs = std::filesystem;
  CZ_CHECK_IO(fs::is_directory(dir), "cifar10:{}: no such directory", dir);
  // The official archive unpacks into cifar-10-batches-bin/; accept its parent too.
  fs::path root = dir;
  if (!fs::exists(root / "data_batch_1.bin") && fs::exists(root / "cifar-10-batches-bin"))
    root /= "cifar-10-batches-bin";
  auto data = std::make_shared<Cifar10Dataset>(dir, split);
  if (split == Split::train) {
    for (int i = 1; i <= 5; ++i) data->add_file((root / fmt::format("data_batch_{}.bin", i)).string());
  } else {
    data->add_file((root / "test_batch.bin").string());
  }
  return data;
}

}  // namespace cz
