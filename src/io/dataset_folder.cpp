// folder:DIR — one sub-folder per class (labels follow the sorted folder names), JPEG and PNG files inside,
// decoded on demand; the loader resizes them.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <vector>

#include "io/dataset_sources.h"
#include "io/image_codec.h"
#include "tensor/check.h"

namespace cz {
namespace {

// Directory entries, as IoError naming the folder instead of std::filesystem_error.
std::vector<std::filesystem::directory_entry> list_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::vector<std::filesystem::directory_entry> entries;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    entries.push_back(*it);
  CZ_CHECK_IO(!ec, "folder:{}: cannot list: {}", dir.string(), ec.message());
  return entries;
}

bool is_image_name(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

class FolderDataset final : public Dataset {
 public:
  explicit FolderDataset(std::string dir) : dir_(std::move(dir)) {
    namespace fs = std::filesystem;
    CZ_CHECK_IO(fs::is_directory(dir_), "folder:{}: no such directory", dir_);
    std::vector<fs::path> classes;
    for (const fs::directory_entry& e : list_dir(dir_))
      if (e.is_directory() && e.path().filename().string().front() != '.') classes.push_back(e.path());
    CZ_CHECK_IO(!classes.empty(), "folder:{}: no class sub-folders (expected DIR/<class>/<image>.jpg|png)",
                dir_);
    std::sort(classes.begin(), classes.end());
    for (size_t c = 0; c < classes.size(); ++c) {
      std::vector<fs::path> files;
      for (const fs::directory_entry& e : list_dir(classes[c]))
        if (e.is_regular_file() && is_image_name(e.path())) files.push_back(e.path());
      CZ_CHECK_IO(!files.empty(), "folder:{}: class folder '{}' has no .jpg, .jpeg or .png files", dir_,
                  classes[c].filename().string());
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) {
        files_.push_back(f.string());
        labels_.push_back(int64_t(c));
      }
    }
    classes_ = int64_t(classes.size());
  }

  int64_t size() const override { return int64_t(files_.size()); }
  int64_t num_classes() const override { return classes_; }
  int64_t label(int64_t index) const override { return labels_[size_t(index)]; }
  std::string describe() const override {
    return fmt::format("folder:{} ({} images, {} classes)", dir_, size(), classes_);
  }

  void read(int64_t index, Image& out) const override {
    CZ_CHECK(index >= 0 && index < size(), "folder:{}: index {} out of range [0, {})", dir_, index, size());
    const std::string& path = files_[size_t(index)];
    const std::vector<uint8_t> bytes = read_file_bytes(path);
    decode_image(bytes.data(), bytes.size(), path, out);
  }

 private:
  std::string dir_;
  std::vector<std::string> files_;
  std::vector<int64_t> labels_;
  int64_t classes_ = 0;
};

}  // namespace

std::shared_ptr<const Dataset> open_folder(const std::string& dir) {
  return std::make_shared<FolderDataset>(dir);
}

}  // namespace cz
