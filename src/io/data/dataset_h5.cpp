// h5:FILE — `images` uint8 (N, H, W, 3) and `labels` integer (N), and optionally an integer attribute
// `num_classes` on the file (when the last classes have no example), read through the HDF5 C API after the
// file has been probed in a separate process (h5_probe.h). Debian's build is thread-safe, so worker threads
// may call it concurrently; with a build that is not, reads take a lock.
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <vector>

#include "io/data/dataset_sources.h"
#include "io/decode/image_codec.h"
#include "io/h5/h5_probe.h"
#include "tensor/check.h"

namespace cz {
namespace {

// Labels are held in memory (8 bytes each); a corrupt header claiming more must not allocate gigabytes.
constexpr int64_t kMaxExamples = int64_t(1) << 27;
constexpr int64_t kMaxLabel = (int64_t(1) << 31) - 1;

// An HDF5 identifier closed on scope exit.
class H5Id {
 public:
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() {
    if (id_ >= 0) close_(id_);
  }
  H5Id(H5Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its error stack to stderr by default; our exceptions say what failed. Per thread in a
// thread-safe build.
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

std::string type_str(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t bits = H5Tget_size(type) * 8;
  if (cls == H5T_INTEGER) return fmt::format("{}int{}", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", bits);
  if (cls == H5T_FLOAT) return fmt::format("float{}", bits);
  return fmt::format("a non-numeric type (class {})", int(cls));
}

std::vector<hsize_t> dims_of(const H5Id& dset) {
  H5Id space(H5Dget_space(dset.get()), H5Sclose);
  const int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  std::vector<hsize_t> dims(size_t(std::max(rank, 0)));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

std::string dims_str(const std::vector<hsize_t>& d) {
  return fmt::format("({})", fmt::join(d, ", "));
}

H5Id open_dataset_named(const H5Id& file, const std::string& path, const char* name) {
  const bool exists = H5Lexists(file.get(), name, H5P_DEFAULT) > 0;
  CZ_CHECK_IO(exists, "h5:{}: dataset '{}' is missing (expected images uint8 (N, H, W, 3) and labels (N))",
              path, name);
  H5Id dset(H5Dopen2(file.get(), name, H5P_DEFAULT), H5Dclose);
  CZ_CHECK_IO(dset.ok(), "h5:{}: '{}' is not a readable dataset", path, name);
  return dset;
}

class H5Dataset final : public Dataset {
 public:
  explicit H5Dataset(const std::string& path)
      : path_(path), file_(open_file(path), H5Fclose), images_(open_dataset_named(file_, path, "images")) {
    QuietErrors quiet;
    H5Id itype(H5Dget_type(images_.get()), H5Tclose);
    CZ_CHECK_IO(itype.ok() && H5Tget_class(itype.get()) == H5T_INTEGER && H5Tget_size(itype.get()) == 1 &&
                    H5Tget_sign(itype.get()) == H5T_SGN_NONE,
                "h5:{}: dataset 'images' must be uint8, found {}", path, type_str(itype.get()));
    const std::vector<hsize_t> d = dims_of(images_);
    CZ_CHECK_IO(d.size() == 4 && d[3] == 3 && d[1] > 0 && d[2] > 0,
                "h5:{}: dataset 'images' must have shape (N, H, W, 3), found {}", path, dims_str(d));
    CZ_CHECK_IO(d[0] > 0 && d[0] <= hsize_t(kMaxExamples),
                "h5:{}: dataset 'images' holds {} images; expected 1 to {}", path, d[0], kMaxExamples);
    CZ_CHECK_IO(d[1] * d[2] <= hsize_t(kMaxImagePixels), "h5:{}: images of {}x{} exceed the {}-pixel limit",
                path, d[1], d[2], kMaxImagePixels);
    n_ = int64_t(d[0]);
    height_ = int64_t(d[1]);
    width_ = int64_t(d[2]);
    read_labels();
  }

  int64_t size() const override { return n_; }
  int64_t num_classes() const override { return classes_; }
  int64_t label(int64_t index) const override { return labels_[size_t(index)]; }
  std::string describe() const override {
    return fmt::format("h5:{} ({} images {}x{}, {} classes)", path_, n_, height_, width_, classes_);
  }

  void read(int64_t index, Image& out) const override {
#ifndef H5_HAVE_THREADSAFE
    std::lock_guard<std::mutex> lock(mutex_);
#endif
    CZ_CHECK(index >= 0 && index < n_, "h5:{}: index {} out of range [0, {})", path_, index, n_);
    QuietErrors quiet;
    out.height = height_;
    out.width = width_;
    out.pixels.resize(size_t(height_ * width_ * 3));
    H5Id fspace(H5Dget_space(images_.get()), H5Sclose);
    const hsize_t start[4] = {hsize_t(index), 0, 0, 0};
    const hsize_t count[4] = {1, hsize_t(height_), hsize_t(width_), 3};
    const hsize_t flat = hsize_t(height_ * width_ * 3);
    H5Id mspace(H5Screate_simple(1, &flat, nullptr), H5Sclose);
    const bool ok = fspace.ok() && mspace.ok() &&
                    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0 &&
                    H5Dread(images_.get(), H5T_NATIVE_UINT8, mspace.get(), fspace.get(), H5P_DEFAULT,
                            out.pixels.data()) >= 0;
    CZ_CHECK_IO(ok,
                "h5:{}: cannot read image {} of dataset 'images' (truncated, corrupt, or compressed with a "
                "filter this HDF5 lacks?)",
                path_, index);
  }

 private:
  static hid_t open_file(const std::string& path) {
    CZ_CHECK_IO(std::filesystem::is_regular_file(path), "h5:{}: no such file", path);
    h5::probe_file(path, "h5:" + path);
    QuietErrors quiet;
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    CZ_CHECK_IO(f >= 0, "h5:{}: not a readable HDF5 file", path);
    return f;
  }

  void read_labels() {
    H5Id labels(open_dataset_named(file_, path_, "labels"));
    H5Id ltype(H5Dget_type(labels.get()), H5Tclose);
    // The size bound matters: libhdf5 sizes its conversion buffer by the stored type, and a corrupt file can
    // claim a gigabyte-wide integer.
    CZ_CHECK_IO(ltype.ok() && H5Tget_class(ltype.get()) == H5T_INTEGER && H5Tget_size(ltype.get()) <= 8,
                "h5:{}: dataset 'labels' must be integer of at most 64 bits, found {}", path_,
                type_str(ltype.get()));
    const std::vector<hsize_t> d = dims_of(labels);
    CZ_CHECK_IO(d.size() == 1 && d[0] == hsize_t(n_),
                "h5:{}: dataset 'labels' has shape {}, expected ({}) to match 'images'", path_, dims_str(d),
                n_);
    labels_.resize(size_t(n_));
    CZ_CHECK_IO(H5Dread(labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels_.data()) >= 0,
                "h5:{}: cannot read dataset 'labels' (file truncated or corrupt?)", path_);
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t l = labels_[size_t(i)];
      CZ_CHECK_IO(l >= 0 && l <= kMaxLabel, "h5:{}: dataset 'labels'[{}] = {} is out of range [0, {}]", path_,
                  i, l, kMaxLabel);
      classes_ = std::max(classes_, l + 1);
    }
    read_num_classes_attribute();
  }

  // The file's own class count, where it has one: at least the largest label + 1.
  void read_num_classes_attribute() {
    if (H5Aexists(file_.get(), "num_classes") <= 0) return;
    H5Id attr(H5Aopen(file_.get(), "num_classes", H5P_DEFAULT), H5Aclose);
    H5Id type(attr.ok() ? H5Aget_type(attr.get()) : -1, H5Tclose);
    H5Id space(attr.ok() ? H5Aget_space(attr.get()) : -1, H5Sclose);
    int64_t value = 0;
    CZ_CHECK_IO(type.ok() && space.ok() && H5Tget_class(type.get()) == H5T_INTEGER &&
                    H5Sget_simple_extent_npoints(space.get()) == 1 &&
                    H5Aread(attr.get(), H5T_NATIVE_INT64, &value) >= 0,
                "h5:{}: attribute 'num_classes' must be one integer", path_);
    CZ_CHECK_IO(value >= classes_ && value <= kMaxLabel + 1,
                "h5:{}: attribute num_classes = {}, but dataset 'labels' holds label {}", path_, value,
                classes_ - 1);
    classes_ = value;
  }

  std::string path_;
  H5Id file_, images_;
  int64_t n_ = 0, height_ = 0, width_ = 0, classes_ = 0;
  std::vector<int64_t> labels_;
#ifndef H5_HAVE_THREADSAFE
  mutable std::mutex mutex_;
#endif
};

}  // namespace

std::shared_ptr<const Dataset> open_h5(const std::string& path) {
  QuietErrors quiet;
  return std::make_shared<H5Dataset>(path);
}

}  // namespace cz
