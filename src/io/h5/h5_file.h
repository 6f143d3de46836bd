// A small RAII layer over the HDF5 C library for weight files, checkpoints and test fixtures: list, inspect
// and read datasets (whole or a range), read root attributes, and write a new file crash-safely (temp file
// beside it, renamed on commit()), optionally with checksummed chunks and virtual datasets. Every failure is
// an IoError naming the file (and the key), with HDF5's own reason appended.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace cz::h5 {
namespace detail {
struct WriteStatus;
}  // namespace detail

struct DatasetInfo {
  Shape shape;
  DType dtype = DType::f32;  // the file's element type: f16/f32/f64 for floats, i32/i64/u8 for integers
};

struct CreateOptions {
  // HDF5 1.8+ structures (library version bounds v18..latest): checksummed metadata, so a damaged header
  // is reported instead of misread, and dense attribute storage (no 64 KiB limit on a file's attributes).
  // h5py and HDF5 >= 1.8 tools read such files.
  bool modern_format = false;
};

struct WriteOptions {
  // Stored in chunks along the first dimension, each followed by HDF5's Fletcher-32 checksum (filter
  // H5Z_FILTER_FLETCHER32); HDF5 verifies every chunk it reads, so do h5py and h5dump. Scalars and empty
  // tensors are stored plainly.
  bool checksum = false;
  int64_t max_chunk_bytes = int64_t{4} << 20;
};

// One source of a virtual dataset: a whole 1-D dataset `dataset` of `numel` elements in `file` (a path
// relative to the virtual dataset's file, as HDF5 resolves it), placed at elements [begin, begin + numel) of
// the virtual dataset's row-major flattening.
struct VirtualSource {
  std::string file;
  std::string dataset;
  int64_t begin = 0;
  int64_t numel = 0;
};

struct OpenOptions {
  // Open it the way HDF5 opens the sources of virtual datasets (weak close), so that the same process can
  // also read a virtual dataset built on it; a file open twice with different close degrees cannot be shared.
  bool vds_source = false;
  // Walk the file in a separate process first (Note [Probing HDF5 files] in h5_probe.h). Off only for a file
  // this process has probed already (a checkpoint's rank file opened again after being closed).
  bool probe = true;
  // Probe also the files its virtual datasets map from, for a reader that reads through them (a weight import
  // of a checkpoint index). A checkpoint reads its rank files itself and probes each when it first needs it.
  bool probe_virtual_sources = false;
};

// Debian's serial HDF5 is built thread-safe (H5_HAVE_THREADSAFE: one global lock), so Files may be used from
// several threads; the calls are serialised inside the library.
class File {
 public:
  // Read-only. IoError naming `path` when it is missing, unreadable or not an HDF5 file, or when the probe
  // finds that libhdf5 crashes on it.
  static File open(const std::string& path, const OpenOptions& options = {});
  // A new file that appears under `path` only when commit() succeeds; until then it is written to a temporary
  // file in the same directory (so the final rename is atomic), which is removed if the File dies
  // uncommitted.
  static File create(const std::string& path, const CreateOptions& options = {});

  File(File&& other) noexcept;
  File& operator=(File&&) = delete;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }

  // Every dataset reachable through hard links, as slash-separated paths without the leading '/', sorted.
  std::vector<std::string> datasets() const;
  DatasetInfo info(const std::string& key) const;
  // A contiguous CPU tensor of the dataset's shape: f64 datasets as f64, other floats (f16, f32) as f32,
  // integers as i64.
  Tensor read(const std::string& key) const;
  // Elements [begin, begin + out.numel()) of the 1-D dataset `key` into `out`, a contiguous CPU tensor of the
  // dtype read() gives for it (f32, f64 or i64). Only the chunks holding the range are read (and verified).
  void read_range(const std::string& key, int64_t begin, const Tensor& out) const;

  // Attributes of the root group. Numbers are converted (an int attribute reads as a double); int_attrs reads
  // a scalar or a 1-D array.
  std::vector<int64_t> int_attrs(const std::string& name) const;
  int64_t int_attr(const std::string& name) const;
  double double_attr(const std::string& name) const;
  std::string string_attr(const std::string& name) const;
  bool has_attr(const std::string& name) const;

  // Writing (files from create() only). `key` may contain '/' (groups are created); t: contiguous CPU,
  // f16/f32/f64/i64/u8.
  void write(const std::string& key, const Tensor& t, const WriteOptions& options = {});
  // An f32 virtual dataset of `shape` pieced together from `sources` (HDF5 VDS, read by h5py and h5dump as an
  // ordinary dataset). Elements no source covers, or whose source file is missing, read as `fill`.
  // Appends `rows` (a contiguous CPU tensor of at least one dimension, dtypes as write()) to the dataset
  // `key` along its first dimension, creating it at the first call: chunked, unlimited along the first
  // dimension, one chunk per first call's worth of rows. Later calls must give the same trailing dimensions.
  // For files written as they go (--dump-batches), which commit() makes visible at the end.
  void append(const std::string& key, const Tensor& rows);
  void write_virtual(const std::string& key, const Shape& shape, const std::vector<VirtualSource>& sources,
                     float fill);
  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, int64_t value);
  void set_attr(const std::string& name, const std::vector<int64_t>& values);  // a 1-D i64 array
  void set_attr(const std::string& name, double value);
  // Flushes, syncs and renames the temporary file to path(); the File is closed afterwards.
  void commit();

 private:
  File(std::string path, std::string temp_path, int64_t id);
  void close() noexcept;
  // Note [Abandoning a failed file].
  void abandon() noexcept;
  void check_writable(const char* what) const;
  [[noreturn]] void fail_write(const std::string& what);
  void write_ok(int64_t status, const std::string& what);
  int64_t write_id(int64_t id, const std::string& what);

  std::string path_;
  std::string temp_path_;  // non-empty while a created file is uncommitted
  int64_t id_ = -1;        // hid_t
  bool abandoned_ = false;
  std::unique_ptr<detail::WriteStatus> status_;  // files being written: what their driver reports
};

}  // namespace cz::h5
