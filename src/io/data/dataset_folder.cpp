// folder:DIR — one sub-folder per class (labels follow the sorted folder names, which are the class names),
// JPEG and PNG files inside, decoded on demand; the loader resizes them. What the scan leaves out (hidden
// files, other formats, files outside the class folders, nested folders) is counted and named by describe(),
// which the run's start line prints: nothing is skipped silently.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <vector>

#include "io/data/dataset_sources.h"
#include "io/decode/image_codec.h"
#include "io/decode/jpeg_region.h"
#include "tensor/check.h"

namespace cz {
namespace {

namespace fs = std::filesystem;

// Directory entries sorted by name (so that reports do not depend on the file system's order), as IoError
// naming the folder instead of std::filesystem_error.
std::vector<fs::directory_entry> list_dir(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::directory_entry> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(*it);
  CZ_CHECK_IO(!ec, "folder:{}: cannot list: {}", dir.string(), ec.message());
  std::sort(entries.begin(), entries.end());
  return entries;
}

std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return ext;
}

bool is_image_name(const fs::path& p) {
  const std::string ext = lower_extension(p);
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// Dot-files are metadata, not pictures: macOS's AppleDouble `._x.jpg` beside every x.jpg copied from a Mac
// (a 4 KB resource fork that is no JPEG), `.DS_Store`, editors' swap files. Hidden folders likewise
// (`.ipynb_checkpoints`, `.git`).
bool is_hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name.front() == '.';
}

// The reason an entry of a class folder is not an image this source reads.
std::string skip_reason(const fs::directory_entry& e) {
  if (is_hidden(e.path())) return "hidden";
  if (e.is_directory()) return "nested folder, not read";
  if (!e.is_regular_file()) return "not a regular file";  // a dangling link, a socket, ...
  const std::string ext = lower_extension(e.path());
  return fmt::format("{}, not JPEG or PNG", ext.empty() ? "without extension" : ext);
}

class FolderDataset final : public Dataset {
 public:
  explicit FolderDataset(std::string dir) : dir_(std::move(dir)) {
    CZ_CHECK_IO(fs::is_directory(dir_), "folder:{}: no such directory", dir_);
    std::vector<fs::path> classes;
    for (const fs::directory_entry& e : list_dir(dir_)) {
      if (is_hidden(e.path()))
        skipped_.add("hidden", e.path().filename().string());
      else if (e.is_directory())
        classes.push_back(e.path());
      else
        skipped_.add("outside the class folders", e.path().filename().string());
    }
    CZ_CHECK_IO(!classes.empty(), "folder:{}: no class sub-folders (expected DIR/<class>/<image>.jpg|png)",
                dir_);
    std::sort(classes.begin(), classes.end());
    for (size_t c = 0; c < classes.size(); ++c) {
      const std::string name = classes[c].filename().string();
      std::vector<fs::path> files;
      LeftOut here;
      for (const fs::directory_entry& e : list_dir(classes[c])) {
        if (e.is_regular_file() && is_image_name(e.path()) && !is_hidden(e.path())) {
          files.push_back(e.path());
        } else {
          const std::string relative = name + "/" + e.path().filename().string();
          here.add(skip_reason(e), relative);
          skipped_.add(skip_reason(e), relative);
        }
      }
      CZ_CHECK_IO(!files.empty(), "folder:{}: class folder '{}' has no .jpg, .jpeg or .png files{}", dir_,
                  name, here.total() > 0 ? " (" + here.describe() + ")" : "");
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) {
        files_.push_back(f.string());
        labels_.push_back(int64_t(c));
      }
      names_.push_back(name);
    }
  }

  int64_t size() const override { return int64_t(files_.size()); }
  int64_t num_classes() const override { return int64_t(names_.size()); }
  int64_t label(int64_t index) const override { return labels_[size_t(index)]; }
  std::vector<std::string> class_names() const override { return names_; }
  // "folder:/d/train (90 images, 3 classes: cat, coffee, rocket; skipped 2: 1 hidden (cat/._a.jpg); ...)"
  std::string describe() const override {
    return fmt::format("folder:{} ({} images, {} classes: {}{})", dir_, size(), names_.size(),
                       join_names(names_), skipped_.total() > 0 ? "; " + skipped_.describe() : "");
  }

  void read(int64_t index, Image& out) const override {
    CZ_CHECK(index >= 0 && index < size(), "folder:{}: index {} out of range [0, {})", dir_, index, size());
    const std::string& path = files_[size_t(index)];
    const std::vector<uint8_t> bytes = read_file_bytes(path);
    decode_image(bytes.data(), bytes.size(), path, out);
  }

  void read_crop(int64_t index, const CropChooser& choose, int64_t out_size, Image& out,
                 CropBox& box) const override {
    CZ_CHECK(index >= 0 && index < size(), "folder:{}: index {} out of range [0, {})", dir_, index, size());
    const std::string& path = files_[size_t(index)];
    const std::vector<uint8_t> bytes = read_file_bytes(path);
    decode_crop(bytes.data(), bytes.size(), path, choose, out_size, out, box);
  }

 private:
  std::string dir_;
  std::vector<std::string> files_;
  std::vector<int64_t> labels_;
  std::vector<std::string> names_;
  LeftOut skipped_;  // entries left out of the data set, named relative to DIR
};

}  // namespace

// Note [Decoding the crop] (jpeg_region.h): JPEGs other than CMYK decode only the crop, scaled in the DCT by
// the largest of 1/8, 1/4, 1/2 that keeps its shorter side at out_size or more; PNGs whole.
void decode_crop(const uint8_t* bytes, size_t size, const std::string& name,
                 const Dataset::CropChooser& choose, int64_t out_size, Image& out, CropBox& box) {
  const std::optional<JpegInfo> info = jpeg_region_info(bytes, size, name);
  if (!info) {
    decode_image(bytes, size, name, out);
    box = choose(out.height, out.width);
    return;
  }
  const CropBox crop = choose(info->height, info->width);
  const int denom = jpeg_scale_for(crop.h, crop.w, out_size);
  JpegRegion r;
  r.image = std::move(out);  // its memory reused
  decode_jpeg_region(bytes, size, name, crop.y, crop.x, crop.h, crop.w, denom, r);
  out = std::move(r.image);
  box = CropBox{0, 0, out.height, out.width, crop.flip};
}

std::shared_ptr<const Dataset> open_folder(const std::string& dir) {
  return std::make_shared<FolderDataset>(dir);
}

}  // namespace cz
